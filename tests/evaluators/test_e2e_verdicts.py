"""End to end: agent sessions through the real gateway, mirrored to simulator candidates, stored
in SQLite, judged by the evaluators — the verdicts the product exists to give."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

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

# A decode step of the simulators is 8 ms x TIME_SCALE. Every chunk gap the worker and the mirror
# process time also carries their own per-chunk cost and scheduling delay, which pulls a TPOT ratio
# toward 1 and, on a busy two-core host, past it: at 0.15 (1.2 ms steps) bi-kv's TPOT measured
# 0.95 [0.91, 0.99] here and once straddled the 1.05 margin in CI ("TPOT undecided"); at 0.25
# (2 ms) it measures 0.89 [0.84, 0.96], the simulator's own difference further above the noise.
TIME_SCALE = 0.25
ARMS = {  # candidate name -> (simulator profile, kind)
    "control": ("control", "control"),
    "bi-kv": ("bi-kv", "bi-kv"),
    "quantized": ("quantized", "quantized"),
    "same": ("baseline", "same-config"),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run shared by the module's tests (it takes ~30 s)."""
    return asyncio.run(_scenario(tmp_path_factory.mktemp("e2e")))


async def _scenario(tmp: Path) -> dict[str, Any]:
    """100 six-turn sessions through the gateway, every candidate mirrored at 100 %."""
    sims: dict[str, SimServer] = {}
    try:
        sims["live"] = await start_sim(get_profile("baseline", time_scale=TIME_SCALE))
        for name, (profile, _kind) in ARMS.items():
            sims[name] = await start_sim(get_profile(profile, time_scale=TIME_SCALE))
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": sims["live"].url,
                "db_url": f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
                # The simulators share this test's event loop, so loop lag and CPU measure them
                # too; a lenient guard keeps it from shedding the copies under test.
                "mirror_shed_loop_lag_ms": 500.0,
                "mirror_shed_cpu_busy": 0.0,
                # The mirror process at idle priority gets almost no CPU on a saturated test
                # host; this test is about verdicts, not priority.
                "mirror_priority": "normal",
                # It asks for reports: wait for the report process however busy the host.
                "report_start_wait_s": 120.0,
                # 100 sessions show a rate within ~4 pp at best (sessions are the units).
                "verdict": {
                    "error_delta": 0.05,
                    "error_critical": 0.1,
                    "slo_exceedance_delta": 0.05,
                    "agreement_delta": 0.05,
                    "similarity_delta": 0.05,
                    # Every turn declares tools: validity gates too, at a margin 100 sessions
                    # can show.
                    "tool_validity_delta": 0.05,
                    "tool_validity_critical": 0.1,
                },
                "candidates": [
                    {
                        "name": name,
                        "url": sims[name].url,
                        "kind": kind,
                        "sample_rate": 1.0,
                        "sampling": "session",
                        "concurrency": 16,
                    }
                    for name, (_profile, kind) in ARMS.items()
                ],
            },
        )
        async with running(config) as parts:
            spec = WorkloadSpec(sessions=100, turns=6, concurrency=16, seed=7)
            summary = await run_workload(parts.url, spec)
            await parts.mirror.wait_idle()
        engine = make_engine(config.storage.db_url)
        settings = VerdictSettings().with_overrides(config.verdict)
        try:
            out: dict[str, Any] = {"summary": summary}
            for name in ARMS:
                if name != "control":
                    out[name] = await evaluate(engine, name, settings=settings, planned_look=True)
        finally:
            await engine.dispose()
        return out
    finally:
        for sim in sims.values():
            await sim.close()


def test_production_served_every_turn(reports: dict[str, Any]) -> None:
    """Production answered all 600 turns while three candidates and a control were mirrored."""
    summary = reports["summary"]
    assert (summary.requests, summary.errors) == (600, 0)


def test_bi_kv_candidate_is_promoted_on_later_turn_ttft(reports: dict[str, Any]) -> None:
    """A candidate that keeps session KV is promoted, and its later-turn TTFT is lower."""
    report: Report = reports["bi-kv"]
    assert report.verdict == "promote", report.reasons
    goal = report.metrics["ttft_later_turns"]
    assert goal.ci_high is not None and goal.ci_high < 1.0
    later = [row for row in report.ttft_by_turn if row["turn"] != "1"]
    assert later and all(float(row["ratio"] or 1.0) < 1.0 for row in later)
    cached = [float(row["cached_fraction_candidate"] or 0.0) for row in later]
    # The candidate reports a later turn's earlier context as cached: at turn 2 a third or more
    # (the call and a large tool result arrive after turn 1), most of the prompt from then on.
    assert min(cached) > 0.25 and sum(cached) / len(cached) > 0.5, cached


def test_divergent_quantized_candidate_is_not_promoted(reports: dict[str, Any]) -> None:
    """A candidate whose answers diverge 30 % of the time at temperature 0 is not promoted, its
    extra disagreement shown with the session as the unit (100 sessions bound it above 0, but
    not yet past the Holm-corrected margin, so reject waits for more sessions)."""
    report: Report = reports["quantized"]
    assert report.verdict != "promote", report.reasons
    divergence = report.metrics["exact_match"]
    assert divergence.ci_low is not None and divergence.ci_low > 0.0
    assert divergence.units == 100 and divergence.status in ("undecided", "beyond", "critical")


def test_identical_candidate_is_never_rejected(reports: dict[str, Any]) -> None:
    """A candidate with production's exact configuration is not rejected."""
    report: Report = reports["same"]
    assert report.verdict != "reject", report.reasons
