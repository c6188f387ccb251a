"""End to end: a model upgrade judged by an LLM grader. Agent sessions through the real gateway,
mirrored to simulator upgrades whose every answer differs from production's, graded in the
mirror process by simulator graders with a planted position bias, stored in SQLite and judged
by the evaluators: promoted by preference when the grader is indifferent (exact match would
have rejected it), rejected when the grader prefers production's answers (net about -18 pp),
and the cap holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from domain.records import NOT_GRADED_OUTCOMES
from evaluators.judge.settings import VerdictSettings
from evaluators.report.build import evaluate
from evaluators.report.model import Report
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim
from gateway.sim.workload import WorkloadSpec, run_workload
from storage.engine import make_engine

pytestmark = pytest.mark.slow

TIME_SCALE = 0.25
SESSIONS = 300
CAP = 5  # the capped candidate's grader calls per minute
# Verdict margins a 300-session test can show (as tests/evaluators/test_e2e_verdicts.py); this
# test is about preference, so latency gets a 10 % margin too, and tool-call validity 2 pp: every
# turn declares tools, and 300 sessions with no invalid call in either arm show the difference
# within about ±1.3 pp at best, never within the default 1 pp.
LOOSE = {
    "error_delta": 0.05,
    "error_critical": 0.1,
    "slo_exceedance_delta": 0.05,
    "latency_delta": 1.1,
    "tool_validity_delta": 0.02,
    "tool_validity_critical": 0.02,
}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run shared by the module's tests."""
    return asyncio.run(_scenario(tmp_path_factory.mktemp("grading")))


def _grader(sim: SimServer, **extra: Any) -> dict[str, Any]:
    # Uncapped unless asked: the default 60 a minute would grade a fraction of the pairs, and
    # the default 2 M tokens a day about a fifth of them (the agent contexts, tool results
    # included, make a grading ~2,600 tokens: 1,800 pairs graded both ways are ~9 M tokens),
    # the rest recorded over cap and only the first ~70 sessions graded.
    cap = {"max_per_minute": 1_000_000, "daily_token_budget": 1 << 40}
    return {"url": sim.url, "model": "sim-model", "price_per_mtok": 1.0, **cap, **extra}


async def _scenario(tmp: Path) -> dict[str, Any]:
    sims: dict[str, SimServer] = {}
    try:
        for name, profile, knobs in (
            ("live", "baseline", {}),
            ("control", "control", {}),
            ("upgrade", "upgrade", {}),
            ("worse", "upgrade", {}),
            ("capped", "upgrade", {}),
            # An indifferent grader that picks the first-shown answer a quarter of the time.
            ("fair-grader", "grader", {"time_scale": 0.02}),
            # A grader preferring production's style 80:20 where the two answers differ in
            # style (same position bias); call turns where both arms make the same call are
            # graded too, and there it picks either side: about -18 pp net over all pairs.
            ("strict-grader", "grader", {"grader_prefers_new": 0.2, "time_scale": 0.02}),
        ):
            knobs = {"time_scale": TIME_SCALE, **knobs}
            sims[name] = await start_sim(get_profile(profile, **knobs))
        cand = {"sample_rate": 1.0, "sampling": "session", "concurrency": 16}
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": sims["live"].url,
                "db_url": f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
                "mirror_shed_loop_lag_ms": 500.0,
                "mirror_shed_cpu_busy": 0.0,
                "mirror_priority": "normal",
                "report_start_wait_s": 120.0,
                # Every pair of the three upgrades may wait for the one grading task at once.
                "mirror.grading_max_pending": 5_000,
                "verdict": LOOSE,
                "candidates": [
                    {"name": "control", "url": sims["control"].url, "kind": "control", **cand},
                    {
                        "name": "upgrade",
                        "url": sims["upgrade"].url,
                        "kind": "model-upgrade",
                        # 300 sessions show a net preference of 0 within 25 pp in 99 % of
                        # runs of tests/evaluators/preference_world.py (every pair graded both
                        # ways: the position bias cancels within a pair).
                        "verdict": {"preference_delta": 0.25},
                        "grader": _grader(sims["fair-grader"], swap_rate=1.0),
                        **cand,
                    },
                    {
                        "name": "worse",
                        "url": sims["worse"].url,
                        "kind": "model-upgrade",
                        "verdict": {"preference_delta": 0.02},
                        "grader": _grader(sims["strict-grader"], swap_rate=1.0),
                        **cand,
                    },
                    {
                        "name": "capped",
                        "url": sims["capped"].url,
                        "kind": "model-upgrade",
                        "grader": _grader(sims["fair-grader"], max_per_minute=CAP),
                        **cand,
                    },
                ],
            },
        )
        async with running(config) as parts:
            spec = WorkloadSpec(sessions=SESSIONS, turns=6, concurrency=16, seed=11)
            summary = await run_workload(parts.url, spec)
            await parts.mirror.wait_idle()
        engine = make_engine(config.storage.db_url)
        settings = VerdictSettings().with_overrides(config.verdict)
        try:
            out: dict[str, Any] = {"summary": summary}
            for name in ("upgrade", "worse", "capped"):
                out[name] = await evaluate(engine, name, settings=settings, planned_look=True)
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT endpoint, outcome, graded_at FROM gradings WHERE outcome NOT IN"
                        f" ({', '.join(repr(o) for o in NOT_GRADED_OUTCOMES)}) ORDER BY graded_at"
                    )
                )
                out["gradings"] = [tuple(r) for r in rows]
        finally:
            await engine.dispose()
        return out
    finally:
        for sim in sims.values():
            await sim.close()


def test_production_served_every_turn(outcome: dict[str, Any]) -> None:
    """Production answered all 1,800 turns while three graded upgrades and a control ran."""
    assert (outcome["summary"].requests, outcome["summary"].errors) == (SESSIONS * 6, 0)


def test_indifferent_grader_promotes_an_upgrade_exact_match_would_reject(
    outcome: dict[str, Any],
) -> None:
    """Every text answer of the upgrade differs from production's (tool calls aside), so exact
    match is far past its critical margin; it is information, and the net preference near 0 is
    shown within its 25 pp margin."""
    report: Report = outcome["upgrade"]
    exact = report.metrics["exact_match"]
    assert exact.status == "ungated" and exact.ci_low is not None
    assert exact.ci_low > VerdictSettings().agreement_critical
    pref = report.metrics["preference"]
    assert pref.units is not None and pref.units >= 0.95 * SESSIONS  # call turns graded too
    assert pref.status == "inside", (pref.estimate, pref.ci_low, pref.ci_high)
    assert pref.estimate is not None and abs(pref.estimate) < 0.15
    bias = report.metrics["grader_position_bias"]
    assert bias.estimate is not None and bias.estimate > 0.05  # the planted b = 0.25
    assert report.verdict == "promote", report.reasons


def test_grader_preferring_production_rejects(outcome: dict[str, Any]) -> None:
    """A grader that prefers production's answers (planted net about -18 pp) rejects the
    upgrade on net preference at a 2 pp margin (stricter than the default 5 pp: 300 sessions
    graded both ways show the 16 pp gap through Holm's correction over every guardrail in 99 %
    of the world's runs; a 13 pp gap would need more)."""
    report: Report = outcome["worse"]
    pref = report.metrics["preference"]
    assert pref.estimate is not None and pref.estimate < -0.08
    assert pref.status in ("beyond", "critical"), (pref.estimate, pref.ci_low, pref.ci_high)
    assert report.verdict == "reject", report.reasons


def test_cap_holds(outcome: dict[str, Any]) -> None:
    """The capped grader got at most max_per_minute calls in any 60 s; the rest of its pairs
    are recorded over cap and shown in the report's accounting of gradings."""
    capped = [(o, t) for name, o, t in outcome["gradings"] if name == "capped"]
    sent = sorted(t for o, t in capped if o != "over_cap")
    assert sent
    # Stored at completion (graded_at), a call's send shortly before: any 59 s holds <= CAP.
    assert all(sum(a <= t < a + 59.0 for t in sent) <= CAP for a in sent)
    over = sum(o == "over_cap" for o, _ in capped)
    assert over > 100
    detail = outcome["capped"].metrics["preference"].detail
    assert detail["gradings_over_cap"] == over
