"""On real vLLM (CPU build, tiny model, float32): conversations captured by the gateway and
replayed by `canary capacity` show the higher goodput of prefix caching at a TTFT SLO.

The engines are the test session's (`real_engines`, `tests/fixtures_real_engine.py`, shared
with the real-engine suite): `bi-kv` (prefix caching) is the candidate `pc`, `live` (the same
model without it) its control `nopc`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from gateway.sim.workload import WorkloadSpec, run_workload
from tests.real_engine import engines as eng

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = eng.MODEL


async def _capture(db: str, engines: dict[str, str]) -> None:
    """Sixteen four-turn agent conversations (a shared ~500-token system prompt, context
    growing each turn) through a capturing gateway; the real engines are registered at
    sample_rate 0, so their caches see nothing before the ramp."""
    profile = get_profile("baseline", time_scale=0.02, served_model_names=(MODEL,))
    live, shadow = await start_sim(profile), await start_sim(profile)
    try:
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": live.url,
                "db_url": db,
                "mirror_shed_loop_lag_ms": 500.0,
                "mirror_shed_cpu_busy": 0.0,
                "capture": True,
                "capture_share": 1.0,
                "candidates": [
                    {"name": "shadow", "url": shadow.url, "sample_rate": 1.0,
                     "sampling": "session"},
                    {"name": "pc", "url": engines["pc"], "sample_rate": 0.0,
                     "price_per_hour_usd": 1.0},
                    {"name": "nopc", "url": engines["nopc"], "sample_rate": 0.0,
                     "kind": "control", "price_per_hour_usd": 1.0},
                ],
            },
        )  # fmt: skip
        spec = WorkloadSpec(
            sessions=16, turns=4, concurrency=8, system_prompt_words=150, user_words=20,
            tool_result_words=30, tools_every=0, max_tokens=32, model=MODEL, seed=11,
        )  # fmt: skip
        async with running(config) as parts:
            await run_workload(parts.url, spec)
            await parts.mirror.wait_idle()
    finally:
        await asyncio.gather(live.close(), shadow.close())


async def test_prefix_caching_has_the_higher_goodput_at_a_ttft_slo(
    real_engines: dict[str, eng.Engine], tmp_path: Path
) -> None:
    """The prefix-caching engine reaches a higher capacity at TTFT <= 200 ms than the same
    model without it (ratio above 1), and only it reports prefix-cache hits."""
    db = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    await _capture(db, {"pc": real_engines["bi-kv"].url, "nopc": real_engines["live"].url})
    out = tmp_path / "capacity.json"
    argv = ["capacity", "pc", "--db", db, "--slo", "ttft=200ms", "--loads", "1,2,4,8",
            "--step-seconds", "5", "--format", "json", "--out", str(out)]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    doc = json.loads(out.read_text())
    pc, nopc = doc["candidate"], doc["reference"]
    assert (pc["endpoint"], nopc["endpoint"]) == ("pc", "nopc")
    assert all(s["errors"] == 0 for arm in (pc, nopc) for s in arm["steps"])
    assert pc["capacity"] > nopc["capacity"]
    assert doc["ratio"] is None or doc["ratio"] > 1.0  # None: nopc broke at the first load
    assert max(s["prefix_cache_hit_rate"] or 0.0 for s in pc["steps"]) > 0.5
    assert all(not s["prefix_cache_hit_rate"] for s in nopc["steps"])
