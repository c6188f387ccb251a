"""A report over a window cut by `until` (or `since`) takes its coverage from the window's own
pairs: the copy counters are the whole run's, and copies lost after the window (a candidate
killed later, its sessions' copies shed as broken) must not hold a verdict reached before it.
A report over the whole run still trusts the counters (SQLite and PostgreSQL)."""

from __future__ import annotations

import time

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import synthetic
from evaluators.report.build import evaluate
from storage import queries
from tests.evaluators.test_eval_pairs import register, store

BEFORE = synthetic.Scenario(missing_candidate=0.04)
AFTER = synthetic.Scenario(missing_candidate=0.5)


async def test_a_window_before_the_losses_takes_coverage_from_its_own_pairs(
    db_engine: AsyncEngine,
) -> None:
    await register(db_engine)
    start = time.time() - 3600
    before = synthetic.pairs(BEFORE, 300, seed=3, start=start)
    cut = max(p.received_at for p in before) + 1.0
    after = [
        msgspec.structs.replace(
            p, exchange_id=f"after-{p.exchange_id}", session_key=f"{10_000 + i // 4:032x}"
        )
        for i, p in enumerate(synthetic.pairs(AFTER, 200, seed=4, start=cut + 1.0))
    ]
    assert min(p.received_at for p in after) >= cut
    await store(db_engine, before + after)
    observed = sum(p.candidate is not None for p in before + after)
    # After the cut the candidate died: half its accepted copies lost, and 400 more copies shed
    # as their sessions broke (never accepted, so no pair shows them).
    counters = {"sampled": 500 + 400, "shed_session_broken": 400, "observed_ok": observed}
    await queries.upsert_counters(db_engine, "r1", {"cand": counters})
    settings = VerdictSettings()

    window = await evaluate(db_engine, "cand", since=0.0, until=cut, settings=settings)
    present = sum(p.candidate is not None for p in before)
    assert window.pairs.n == present
    assert window.pairs.coverage == present / 300  # the window's pairs: observed / accepted
    assert window.pairs.coverage > 0.9
    assert "coverage" not in {r.metric for r in window.reasons if r.status == "insufficient"}
    caveat = [c for c in window.caveats if "whole run" in c]
    assert len(caveat) == 1 and "200 of its exchanges lie outside this window" in caveat[0]
    assert f"{observed / 900:.1%} observed over the whole run" in caveat[0]

    whole = await evaluate(db_engine, "cand", since=0.0, settings=settings)
    assert whole.pairs.coverage == observed / 900  # the counters: shed copies are missing
    assert whole.verdict == "hold"
    assert any(r.metric == "coverage" and r.status == "insufficient" for r in whole.reasons)
    assert not [c for c in whole.caveats if "whole run" in c]
