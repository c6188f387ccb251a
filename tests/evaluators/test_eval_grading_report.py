"""A model upgrade's report from storage, on SQLite and PostgreSQL: gradings written by the real
writer are read back with their exchanges' sessions, net preference gates, exact match is
information, and every renderer shows the grader's tables and the interval-against-pairs plot;
every complete pair is accounted for (graded, or not graded by reason), summed over the rows
two replicas wrote."""

from __future__ import annotations

import html
import time

import msgspec
import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import GraderSpec
from domain.records import GradingRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.gradings import COMPLETE_PAIRS, PAIR_OUTCOMES, accounting_key
from evaluators.report.build import evaluate
from evaluators.report.html import render_html
from evaluators.report.text import render_markdown, render_text
from tests.graded_store import (
    GradedRows,
    exchange,
    insert_rows,
    live_and_upgrade,
    observation,
    write_records,
)

SESSIONS = 400
GRADER = GraderSpec(url="http://127.0.0.1:9", model="judge", price_per_mtok=1.0)


async def _history(engine: AsyncEngine, now: float) -> None:
    """400 one-turn sessions at temperature 0 mirrored to `upgrade`, whose answers all differ
    from production's; its grader prefers it in 60 % of verdicts, production in 20 %."""
    await live_and_upgrade(engine, now - 10_000, GRADER)
    rng = np.random.default_rng(0)
    rows = GradedRows()
    for s in range(SESSIONS):
        rows.session(s, now, rng, candidate_first=bool(s % 2))
    rows.gradings.append(GradingRecord(
        exchange_id="x0000", endpoint="upgrade", reference="live", graded_at=now,
        candidate_first=True, swapped=True, outcome="unparseable", attempts=2,
    ))  # fmt: skip
    stats = await rows.store(engine)
    assert stats["written_gradings"] == SESSIONS + 1


async def test_model_upgrade_report(db_engine: AsyncEngine) -> None:
    """The report gates quality on net preference (about +40 pp here, shown above the -5 pp
    margin), keeps exact match (every answer differs) as information, counts the unparseable
    grading as missing (not a tie), and renders the grader's tables and plot."""
    now = time.time()
    await _history(db_engine, now)
    report = await evaluate(
        db_engine, "upgrade", since=0.0, settings=VerdictSettings(), planned_look=True
    )
    pref = report.metrics["preference"]
    assert pref.gating and pref.n == SESSIONS and pref.units == SESSIONS
    assert pref.estimate is not None and 0.3 < pref.estimate < 0.5
    assert pref.status == "inside"
    assert pref.detail["gradings_unparseable"] == 1
    assert pref.detail["gradings_graded"] == SESSIONS
    assert pref.detail["grader_tokens"] == SESSIONS * 910
    assert report.metrics["exact_match"].status == "ungated"
    assert not report.metrics["exact_match"].ungated_blocks
    assert "grader_position_bias" in report.metrics
    text = render_text(report)
    assert "LLM grader" in text and "position bias" in text and "$0.36" in text
    assert "Net preference by answer length" in render_markdown(report)
    html = render_html(report)
    assert "net preference (LLM grader, order-averaged): interval against pairs" in html
    decoded = msgspec.json.decode(msgspec.json.encode(report))
    assert decoded["metrics"]["preference"]["detail"]["win_share"] > 0.5


# One complete pair per case: (its rows' outcomes in order of their orders, whether it is
# complete). A pair graded in one order and failed in the other is graded; one failed then
# over cap is failed (its first order says); the last has production's answer only.
CASES: list[tuple[tuple[str, ...], bool]] = [
    (("graded",), True),
    (("graded", "failed"), True),
    (("graded",), True),
    (("not_sampled",), True),
    (("not_sampled",), True),
    (("not_sampled",), True),
    (("queue_full",), True),
    (("no_answer",), True),
    (("over_cap",), True),
    (("failed", "over_cap"), True),
    (("unparseable",), True),
    (("stopped",), True),
    ((), True),  # no row at all: unrecorded
    (("not_sampled",), False),  # not a complete pair: not counted
]
WANT = {
    "graded": 3,
    "not_sampled": 3,
    "queue_full": 1,
    "no_answer": 1,
    "over_cap": 1,
    "failed": 1,
    "unparseable": 1,
    "stopped": 1,
    "unrecorded": 1,
}


async def _accounting_history(engine: AsyncEngine, now: float) -> None:
    """The CASES as stored: each pair's rows written by one of two replicas' writers."""
    await live_and_upgrade(engine, now - 10_000, GRADER)
    exchanges, observations = [], []
    rows: list[list[GradingRecord]] = [[], []]
    for i, (outcomes, complete) in enumerate(CASES):
        at = now - 1_000 + i
        xid = f"p{i:04d}"
        exchanges.append(exchange(xid, at, i + 1))
        observations.append(observation(xid, "live", "production", at, f"old {i}"))
        if complete:
            observations.append(observation(xid, "upgrade", "candidate", at, f"new {i}"))
        for order, outcome in enumerate(outcomes):
            sent = outcome in ("graded", "failed", "unparseable")
            rows[i % 2].append(GradingRecord(
                exchange_id=xid, endpoint="upgrade", reference="live", graded_at=at + 1,
                candidate_first=order == 0, swapped=order == 1, outcome=outcome,  # type: ignore[arg-type]
                winner="candidate" if outcome == "graded" else None, attempts=int(sent),
            ))  # fmt: skip
    await insert_rows(engine, exchanges, observations)
    for replica in rows:
        await write_records(engine, gradings=replica)


async def test_every_complete_pair_is_accounted_for(db_engine: AsyncEngine) -> None:
    """Graded pairs plus the pairs not graded, by reason, add up to the report's complete
    pairs, from the rows of both replicas; every renderer (text, markdown, HTML, JSON) shows the
    table; the gradings the statistics read are the sent ones only."""
    now = time.time()
    await _accounting_history(db_engine, now)
    report = await evaluate(
        db_engine, "upgrade", since=0.0, settings=VerdictSettings(), planned_look=True
    )
    detail = report.metrics["preference"].detail
    got = {o: detail[accounting_key(o)] for o in PAIR_OUTCOMES}
    assert got == WANT
    assert detail[COMPLETE_PAIRS] == sum(WANT.values()) == report.pairs.n == len(CASES) - 1
    # The statistics see gradings only: 3 graded, 2 failed, 2 over cap, 1 unparseable.
    assert detail["gradings_graded"] == 3 and detail["gradings_failed"] == 2
    assert detail["gradings_over_cap"] == 2 and detail["gradings_unparseable"] == 1
    assert detail["pairs_graded"] == 3
    for rendered in (render_text(report), render_markdown(report), render_html(report)):
        rendered = html.unescape(rendered)
        assert "complete pairs: graded, or not graded by reason" in rendered.lower()
        assert "not sampled by the grader's rate" in rendered and "no grading record" in rendered
    decoded = msgspec.json.decode(msgspec.json.encode(report))
    json_detail = decoded["metrics"]["preference"]["detail"]
    assert sum(json_detail[accounting_key(o)] for o in PAIR_OUTCOMES) == json_detail[COMPLETE_PAIRS]
