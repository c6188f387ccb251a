"""People's check from storage, on SQLite and PostgreSQL: gradings and kept pairs written by the
real writer, labels stored through the labelling store, and `evaluate` reports people's
prediction-powered estimate beside the grader's (and gates on it with
`preference_source = "human"`)."""

from __future__ import annotations

import time

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import GraderSpec
from domain.records import LabelItem
from evaluators.human.metric import NAME
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import load as store
from evaluators.report.build import evaluate
from evaluators.report.text import render_text
from storage import labels as label_store
from tests.graded_store import GradedRows, live_and_upgrade

SESSIONS = 400
GRADER = GraderSpec(url="http://127.0.0.1:9", model="judge", label_rate=0.3)


async def _history(engine: AsyncEngine, now: float, verdict: dict[str, float | str]) -> int:
    """One-turn sessions graded 60/20/20 for the candidate; about 30 % kept for people, who
    prefer production on most of them: people's estimate falls well below the grader's."""
    await live_and_upgrade(engine, now - 10_000, GRADER, verdict)
    rng = np.random.default_rng(1)
    rows = GradedRows()
    items, choices = [], []
    for s in range(SESSIONS):
        xid, at = rows.session(s, now, rng, candidate_first=True)
        if rng.random() < GRADER.label_rate:
            items.append(LabelItem(
                exchange_id=xid, endpoint="upgrade", reference="live", unit=f"{s + 1:032x}",
                graded_at=at + 1, conversation="q", candidate_answer="a", reference_answer="b",
            ))  # fmt: skip
            v = rng.random()
            choices.append((xid, "candidate" if v < 0.15 else ("tie" if v < 0.25 else "reference")))
    stats = await rows.store(engine, items)
    assert stats["written_gradings"] == SESSIONS, stats
    assert stats["written_label_items"] == len(items), stats
    for i, (xid, choice) in enumerate(choices):
        rec = label_store.record_of("upgrade", "ann", xid, "ca", choice, now - 100 + i * 0.01)
        await label_store.add_label(engine, rec)
    return len(choices)


async def test_people_estimate_from_storage(db_engine: AsyncEngine) -> None:
    now = time.time()
    n = await _history(db_engine, now, {"preference_source": "human", "min_labels": 40})
    hl = await store.load_labels(db_engine, "upgrade", 0.3)
    assert hl is not None and hl.n == n and len(hl.kept) == n
    report = await evaluate(db_engine, "upgrade", since=now - 10_000, settings=VerdictSettings())
    res = report.metrics[NAME]
    d = res.detail
    assert d, (res.ungated, res.reason)
    assert d["labels"] == n and d["labelled_through_units"] == SESSIONS and d["label_rate"] == 0.3
    assert d["grader_low"] is not None and d["grader_low"] > 0.2  # type: ignore[operator]
    assert d["human_high"] is not None and d["human_high"] < 0.0  # type: ignore[operator]
    assert res.role == "critical" and res.ci_high is not None and res.ci_high < 0.0
    assert report.metrics["preference"].status == "ungated"  # people gate instead
    assert report.verdict == "reject"  # people's -55 pp shown beyond the critical margin
    assert "people, prediction-powered (PPI++)" in render_text(report)
