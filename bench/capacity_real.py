#!/usr/bin/env python3
"""Capacity on real vLLM: prefix caching on vs off, on captured multi-turn conversations.

Run by hand, not in CI. Needs two vLLM servers serving the same tiny model in float32, one with
prefix caching and one without (ports are yours to choose):

    ROOT=.real-engine bash ../shared/real-engine/serve_vllm.sh 8100
    ROOT=.real-engine bash ../shared/real-engine/serve_vllm.sh 8101 --no-enable-prefix-caching
    .venv/bin/python bench/capacity_real.py --pc http://127.0.0.1:8100 \\
        --nopc http://127.0.0.1:8101 --out /tmp/capacity-real

1. Capture: a gateway with `capture = true` (SQLite in --out) proxies --sessions agent-like
   conversations (a shared system prompt, context growing every turn) to a simulated live
   engine serving the model's name, mirrored to a simulated shadow candidate; the real engines
   are registered as candidate `pc` and its control `nopc` with sample_rate 0, so their caches
   see nothing before the ramp.
2. `canary capacity pc` replays the captured conversations against both engines (alternating
   steps, the control as reference) and writes text, JSON and HTML to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from evaluators.capacity.estimate import CapacityResult
from evaluators.capacity.render import render_html, render_text
from gateway.cli.main import main as canary
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from gateway.sim.workload import WorkloadSpec, run_workload

MODEL = "tiny-llama"


def workload(sessions: int, turns: int) -> WorkloadSpec:
    """Agent-like conversations that fit the tiny model's 2048-token context."""
    return WorkloadSpec(
        sessions=sessions,
        turns=turns,
        concurrency=8,
        system_prompt_words=150,
        user_words=20,
        tool_result_words=30,
        tools_every=0,
        max_tokens=32,
        model=MODEL,
        seed=11,
    )


async def capture(db_url: str, pc: str, nopc: str, spec: WorkloadSpec, price: float) -> None:
    live = await start_sim(get_profile("baseline", time_scale=0.02, served_model_names=(MODEL,)))
    shadow = await start_sim(get_profile("baseline", time_scale=0.02, served_model_names=(MODEL,)))
    try:
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": live.url,
                "db_url": db_url,
                "mirror_shed_loop_lag_ms": 500.0,
                "mirror_shed_cpu_busy": 0.0,
                "capture": True,
                "capture_share": 1.0,
                "candidates": [
                    {"name": "shadow", "url": shadow.url, "sample_rate": 1.0,
                     "sampling": "session"},
                    {"name": "pc", "url": pc, "sample_rate": 0.0, "kind": "prefix-cache",
                     "price_per_hour_usd": price},
                    {"name": "nopc", "url": nopc, "sample_rate": 0.0, "kind": "control",
                     "price_per_hour_usd": price},
                ],
            },
        )  # fmt: skip
        async with running(config) as parts:
            await run_workload(parts.url, spec)
            await parts.mirror.wait_idle()
    finally:
        await asyncio.gather(live.close(), shadow.close())


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pc", default="http://127.0.0.1:8100", help="engine with prefix caching")
    p.add_argument("--nopc", default="http://127.0.0.1:8101", help="engine without it")
    p.add_argument("--sessions", type=int, default=48)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--loads", default="1,2,4,8,16")
    p.add_argument("--step-seconds", default="15")
    p.add_argument("--repeats", default="1")
    p.add_argument("--slo", default="ttft=200ms")
    p.add_argument("--price", type=float, default=1.0, help="$/hour of each engine (x 1 GPU)")
    p.add_argument("--out", type=Path, default=Path("/tmp/capacity-real"))
    return p.parse_args()


def run() -> int:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "capacity.db"
    db.unlink(missing_ok=True)
    db_url = f"sqlite+aiosqlite:///{db}"
    asyncio.run(
        capture(db_url, args.pc, args.nopc, workload(args.sessions, args.turns), args.price)
    )
    base = ["capacity", "pc", "--db", db_url, "--slo", args.slo, "--loads", args.loads,
            "--step-seconds", args.step_seconds, "--repeats", args.repeats]  # fmt: skip
    code = canary([*base, "--format", "json", "--out", str(args.out / "capacity.json")])
    if code:
        return code
    # Render the same run as text and HTML (the JSON holds every number; no second ramp).
    result = msgspec.json.decode((args.out / "capacity.json").read_bytes(), type=CapacityResult)
    (args.out / "capacity.html").write_text(render_html(result), encoding="utf-8")
    text = render_text(result)
    (args.out / "capacity.txt").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(run())
