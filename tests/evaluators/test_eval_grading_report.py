"""A model upgrade's report from storage, on SQLite and PostgreSQL: gradings written by the real
writer are read back with their exchanges' sessions, net preference gates, exact match is
information, and every renderer shows the grader's tables and the interval-against-pairs plot."""

from __future__ import annotations

import time

import msgspec
import numpy as np
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint, GraderSpec
from domain.records import ExchangeRecord, GradingRecord, ObservationRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.report.build import evaluate
from evaluators.report.html import render_html
from evaluators.report.text import render_markdown, render_text
from storage import queries
from storage.models import ExchangeRow, ObservationRow
from storage.textguard import exchange_row, observation_row
from storage.writer import ObservationWriter

SESSIONS = 400
GRADER = GraderSpec(url="http://127.0.0.1:9", model="judge", price_per_mtok=1.0)


def _obs(xid: str, endpoint: str, arm: str, at: float, text: str) -> dict[str, object]:
    record = ObservationRecord(
        exchange_id=xid, endpoint=endpoint, arm=arm, started_at=at, status=200,  # type: ignore[arg-type]
        ttft_s=0.2, e2e_s=0.5, output_tokens=10, finish_reason="stop", output_text=text,
    )  # fmt: skip
    return observation_row(record, store_text=True, max_chars=4096)


async def _history(engine: AsyncEngine, now: float) -> None:
    """400 one-turn sessions at temperature 0 mirrored to `upgrade`, whose answers all differ
    from production's; its grader prefers it in 60 % of verdicts, production in 20 %."""
    await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
    await queries.create_endpoint(
        engine, Endpoint(name="upgrade", url="http://c", created_at=now - 10_000, grader=GRADER)
    )
    exchanges, observations = [], []
    rng = np.random.default_rng(0)
    gradings = []
    for s in range(SESSIONS):
        at = now - 5_000 + s * 10
        xid = f"x{s:04d}"
        exchanges.append(exchange_row(ExchangeRecord(
            id=xid, received_at=at, route="/v1/chat/completions", model="m",
            temperature=0.0, targets=("upgrade",), session_key=f"{s + 1:032x}",
        )))  # fmt: skip
        observations.append(_obs(xid, "live", "production", at, f"old answer {s}"))
        observations.append(_obs(xid, "upgrade", "candidate", at, f"a new answer {s}"))
        u = rng.random()
        winner = "candidate" if u < 0.6 else ("reference" if u < 0.8 else "tie")
        gradings.append(GradingRecord(
            exchange_id=xid, endpoint="upgrade", reference="live", graded_at=at + 1,
            candidate_first=bool(s % 2), swapped=False, outcome="graded", winner=winner,  # type: ignore[arg-type]
            candidate_chars=16, reference_chars=13, prompt_tokens=900, completion_tokens=10,
            latency_s=0.3,
        ))  # fmt: skip
    gradings.append(GradingRecord(
        exchange_id="x0000", endpoint="upgrade", reference="live", graded_at=now,
        candidate_first=True, swapped=True, outcome="unparseable", attempts=2,
    ))  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(ExchangeRow), exchanges)
        await conn.execute(insert(ObservationRow), observations)
    writer = ObservationWriter(
        engine,
        batch_size=100,
        flush_interval_s=0.05,
        queue_max=10_000,
        store_text=True,
        store_text_max_chars=4096,
    )
    await writer.start()
    for g in gradings:
        writer.put_grading(g)
    await writer.close()
    assert writer.stats()["written_gradings"] == SESSIONS + 1


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
