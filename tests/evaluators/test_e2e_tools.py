"""End to end: agent traffic judged on tool-call validity. Agent sessions (declared tools, calls
streamed as deltas, parallel calls, tool results appended) through the real gateway runtime
(`gateway.process.runtime.running`, what `canary serve` runs), mirrored to simulated candidates,
every arm's calls checked in the mirror process, stored in SQLite and judged by the evaluators:

* a model upgrade that breaks 30 % of its call answers' arguments, with a grader: rejected on
  validity, whatever the grader prefers;
* a quantized candidate that breaks 30 %, without a control: rejected on validity (validity is
  absolute, it needs no noise floor);
* a model upgrade whose calls are valid but differ from production's (its own arguments and
  words): not rejected on validity;
* call turns are graded: the grader saw pairs whose answers were calls.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

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
SESSIONS = 60
TURNS = 5
LOOSE = {
    "error_delta": 0.05,
    "error_critical": 0.1,
    "slo_exceedance_delta": 0.05,
    "latency_delta": 1.1,
}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run shared by the module's tests."""
    return asyncio.run(_scenario(tmp_path_factory.mktemp("tools")))


async def _scenario(tmp: Path) -> dict[str, Any]:
    sims: dict[str, SimServer] = {}
    try:
        for name, profile, knobs in (
            ("live", "baseline", {}),
            ("upgrade-broken", "upgrade", {"break_calls": 0.3}),
            ("quantized-broken", "quantized", {"break_calls": 0.3}),
            ("upgrade", "upgrade", {}),
            ("grader", "grader", {"time_scale": 0.02}),
        ):
            knobs = {"time_scale": TIME_SCALE, **knobs}
            sims[name] = await start_sim(get_profile(profile, **knobs))
        cand = {"sample_rate": 1.0, "sampling": "session", "concurrency": 16}
        grader = {
            "url": sims["grader"].url,
            "model": "sim-model",
            "price_per_mtok": 1.0,
            "max_per_minute": 1_000_000,
        }
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
                "mirror.grading_max_pending": 5_000,
                "verdict": LOOSE,
                "candidates": [
                    {
                        "name": "upgrade-broken",
                        "url": sims["upgrade-broken"].url,
                        "kind": "model-upgrade",
                        "grader": grader,
                        **cand,
                    },
                    {
                        "name": "quantized-broken",
                        "url": sims["quantized-broken"].url,
                        "kind": "quantized",
                        **cand,
                    },
                    {
                        "name": "upgrade",
                        "url": sims["upgrade"].url,
                        "kind": "model-upgrade",
                        "grader": grader,
                        **cand,
                    },
                ],
            },
        )
        async with running(config) as parts:
            spec = WorkloadSpec(sessions=SESSIONS, turns=TURNS, concurrency=16, seed=5)
            summary = await run_workload(parts.url, spec)
            await parts.mirror.wait_idle()
        engine = make_engine(config.storage.db_url)
        settings = VerdictSettings().with_overrides(config.verdict)
        try:
            out: dict[str, Any] = {"summary": summary}
            for name in ("upgrade-broken", "quantized-broken", "upgrade"):
                out[name] = await evaluate(engine, name, settings=settings, planned_look=True)
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT g.endpoint, g.outcome, o.tool_calls IS NOT NULL"
                        " FROM gradings g JOIN observations o"
                        " ON o.exchange_id = g.exchange_id AND o.arm = 'production'"
                    )
                )
                out["gradings"] = [tuple(r) for r in rows]
                rows = await conn.execute(
                    text("SELECT arm, tool_check, count(*) FROM observations GROUP BY 1, 2")
                )
                out["checks"] = [tuple(r) for r in rows]
        finally:
            await engine.dispose()
        return out
    finally:
        for sim in sims.values():
            await sim.close()


def test_production_served_every_turn(outcome: dict[str, Any]) -> None:
    """Production answered every agent turn while the candidates ran."""
    assert (outcome["summary"].requests, outcome["summary"].errors) == (SESSIONS * TURNS, 0)


def test_every_arm_was_checked_and_production_is_valid(outcome: dict[str, Any]) -> None:
    """Every answer of every arm got a verdict (the workload declares tools on every turn), and
    the simulated production engine's calls are all valid."""
    checks = {(arm, check): n for arm, check, n in outcome["checks"]}
    assert checks.get(("production", None), 0) == 0
    assert checks.get(("production", "valid"), 0) >= SESSIONS * TURNS * 0.99
    assert sum(n for (arm, c), n in checks.items() if arm == "production" and c != "valid") == 0


def test_an_upgrade_breaking_its_calls_is_rejected_on_validity(outcome: dict[str, Any]) -> None:
    """A model upgrade (judged by its grader) whose calls break 30 % of the time is rejected
    by tool-call validity, with the reasons counted."""
    report: Report = outcome["upgrade-broken"]
    m = report.metrics["tool_validity"]
    assert m.status in ("critical", "beyond"), (m.estimate, m.ci_low, m.ci_high, m.n)
    assert report.verdict == "reject"
    assert any("invalid by reason" in note for note in m.notes)
    # The first problems are named by the call, the JSON pointer and the keyword, no value.
    first = [note for note in m.notes if note.startswith("most frequent first problems")]
    assert first and ("call 0" in first[0] or "call 1" in first[0]), m.notes


def test_a_quantized_candidate_breaking_its_calls_is_rejected_without_control(
    outcome: dict[str, Any],
) -> None:
    """No control runs, yet a quantized candidate whose calls break 30 % of the time is
    rejected on validity: validity is absolute and needs no noise floor."""
    report: Report = outcome["quantized-broken"]
    m = report.metrics["tool_validity"]
    assert m.status in ("critical", "beyond") and m.gating
    assert report.verdict == "reject"


def test_valid_calls_with_other_arguments_are_not_rejected(outcome: dict[str, Any]) -> None:
    """An upgrade whose calls are valid but are not production's is not rejected on validity
    (agreement with production is information for it)."""
    m = outcome["upgrade"].metrics["tool_validity"]
    assert m.status not in ("critical", "beyond"), (m.estimate, m.ci_low, m.ci_high)
    assert m.estimate is not None and abs(m.estimate) < 0.02


def test_call_turns_are_graded(outcome: dict[str, Any]) -> None:
    """The grader judged pairs whose production answer was a call."""
    graded_calls = [
        r for r in outcome["gradings"] if r[0] == "upgrade" and r[1] == "graded" and r[2]
    ]
    assert len(graded_calls) >= SESSIONS
