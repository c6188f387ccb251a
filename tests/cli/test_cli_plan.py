"""`canary plan` as an operator runs it: a subprocess, text and JSON output, the live rate read
from a real gateway's /metrics while traffic flows, and exit code 2 with a message on bad input."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from evaluators.judge import plan
from evaluators.judge.settings import STRICT, VerdictSettings
from gateway.config import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim

REPO = Path(__file__).resolve().parents[2]


async def canary(*args: str) -> tuple[int, str, str]:
    """Run `python -m gateway.cli.main ARGS`: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        *args,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "80"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_plan_text_names_every_test_and_the_dominant_one() -> None:
    """For 20 req/s sampled 10 % in 6-turn sessions the text plan lists every gating test with
    sessions, pairs and time, names the one that dominates, and the margins a budget allows."""
    code, out, err = await canary("plan", "--rate", "20", "--turns", "6", "--budget", "1h")
    assert code == 0, err
    for test in ("failures", "agreement", "SLO exceedance", "latency", "goal", "dominates:"):
        assert test in out
    assert "within 60 min: a failure-rate margin down to" in out


async def test_plan_json_matches_the_sizing_core() -> None:
    """The JSON plan's numbers are the sizing core's: units × turns = pairs, pairs ÷ pair rate =
    seconds, and the dominant test is the slowest one."""
    code, out, err = await canary("plan", "--rate", "50", "--turns", "1", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["unit"] == "request" and doc["pairs_per_s"] == 5.0
    for row in doc["needs"]:
        if row["metric"].startswith("logprob divergence"):  # units: the scored pairs (0.1)
            assert row["pairs"] == math.ceil(row["units"] / 0.1)
        else:
            assert row["pairs"] == row["units"]
        assert math.isclose(row["seconds"], row["pairs"] / 5.0)
    slowest = max(doc["needs"], key=lambda r: r["seconds"])
    assert doc["dominant"] == slowest["metric"]
    assert doc["seconds_to_decide"] == slowest["seconds"]


def test_rate_floor_is_log_one_over_alpha_over_delta() -> None:
    """With no discordant unit the rate floor is within 5 % of log(1/α)/(0.8 δ) (3.7/δ at
    α = 0.05: 382 units for 1 pp), and the strict preset's 0.1 pp needs over ten times more."""
    s = VerdictSettings()
    n = plan.rate_units(0.01, s.alpha)
    assert n is not None and abs(n - math.log(1 / s.alpha) / (0.8 * 0.01)) < 0.05 * n
    strict = s.with_overrides(STRICT)
    m = plan.rate_units(strict.error_delta, strict.alpha)
    assert m is not None and m > 10 * n


def test_background_discordance_needs_more_units() -> None:
    """Background failures (one arm failing on 0.1 % of pairs) need more units than none."""
    clean = plan.rate_units(0.01, 0.05)
    noisy = plan.rate_units(0.01, 0.05, discordance=0.05, turns=1)
    assert clean is not None and noisy is not None and noisy > clean


async def test_bad_input_exits_2_naming_the_flag() -> None:
    """A bad rate, sample rate or budget exits 2 with a message naming the flag."""
    for args, flag in (
        (("--rate", "-3"), "--rate"),
        (("--rate", "5", "--sample-rate", "1.5"), "--sample-rate"),
        (("--rate", "5", "--budget", "soon"), "--budget"),
        (("--rate", "5", "--alpha", "0.7"), "alpha"),
        (("--gateway", "ftp://x"), "--gateway"),
    ):
        code, _out, err = await canary("plan", *args)
        assert code == 2 and flag in err and "Traceback" not in err, (args, err)


async def test_plan_reads_the_live_rate_from_a_running_gateway(tmp_path: Path) -> None:
    """`--gateway URL` reads canary_proxy_requests_total twice from a real gateway (a simulator
    as production) while requests flow, and sizes the plan at the measured rate."""
    sim = await start_sim(get_profile("fast"))
    config = load_config(
        None,
        environ={},
        overrides={
            "listen": "127.0.0.1:0",
            "live_url": sim.url,
            "db_url": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        },
    )
    try:
        async with running(config) as parts, aiohttp.ClientSession() as http:
            stop = asyncio.Event()

            async def traffic() -> None:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                while not stop.is_set():
                    async with http.post(f"{parts.url}/v1/chat/completions", json=body) as r:
                        await r.read()
                    await asyncio.sleep(0.02)

            async with asyncio.TaskGroup() as tg:
                tg.create_task(traffic())
                try:
                    code, out, err = await canary(
                        "plan", "--gateway", parts.url, "--probe-s", "2", "--format", "json"
                    )
                finally:
                    stop.set()
        assert code == 0, err
        assert json.loads(out)["rate_rps"] > 1.0
    finally:
        await sim.close()


def test_plan_from_a_running_experiment_measures_each_gating_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`canary plan --candidate` reads the candidate's pairs so far (here 120 three-turn sessions
    drawn from the independent world at real engines' noise): one row per gating test as the
    verdict gates it, turn-1 TTFT apart from the later-turn goal, sized from the noise each
    showed — the turn-1 row, one noisy pair per session, needs the most sessions of the latency
    rows and about what the noise model says at a pair sd of 1.1."""
    import msgspec

    from domain.endpoint import Endpoint
    from gateway.cli.main import main
    from storage import queries
    from storage.engine import make_engine, upgrade
    from tests.evaluators import world
    from tests.evaluators.test_eval_pairs import store

    url = f"sqlite+aiosqlite:///{tmp_path / 'plan.db'}"
    case = next(c for c in world.PLANNED if c.label.startswith("A/A bi-kv, real"))
    pairs = world.draw(case.world, 120, np.random.default_rng(3))
    t0 = time.time() - 3600
    pairs = [msgspec.structs.replace(p, received_at=t0 + p.received_at) for p in pairs]

    async def setup() -> None:
        await upgrade(url)
        engine = make_engine(url)
        try:
            await queries.create_endpoint(
                engine, Endpoint(name="live", url="http://l", role="live")
            )
            for name, kind in (("cand", "bi-kv"), ("ctrl", "control")):
                ep = Endpoint(
                    name=name, url="http://c", kind=kind, sampling="session",
                    verdict=dict(world.REAL_MARGINS),
                )  # fmt: skip
                await queries.create_endpoint(engine, ep)
            await store(engine, pairs)
        finally:
            await engine.dispose()

    asyncio.run(setup())
    args = ["plan", "--candidate", "cand", "--db", url, "--since", "2h", "--format", "json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in doc["needs"]}
    first = next(r for name, r in rows.items() if "ttft_first_turn" in name)
    later = next(r for name, r in rows.items() if "ttft_later_turns" in name)
    overall = next(r for name, r in rows.items() if name.endswith("(ttft)"))
    assert doc["source"].startswith("measured: cand") and doc["turns"] == pytest.approx(3, 0.05)
    assert first["units"] > overall["units"] and later["units"] > 0
    # The horizon is the sessions by which 95 % of runs show every session-unit test together:
    # at least the slowest one's own, within 2 % of the search's precision; the divergence row
    # counts scored pairs (its own units), sized at that horizon.
    sized = [r["units"] for r in doc["needs"] if not r["metric"].startswith("logprob divergence")]
    assert doc["horizon_units"] >= max(sized) * 0.98
    slowest = max(r["seconds"] for r in doc["needs"] if r["seconds"] is not None)
    if doc["seconds_to_decide"] > slowest:  # the horizon, when it is past every test's own
        assert doc["dominant"].startswith("every test together")
    model, _ = plan.needs(
        plan.Traffic(rate_rps=1, sample_rate=1, turns=3, sd_pair=1.1),
        VerdictSettings().with_overrides(world.REAL_MARGINS),
        horizon=doc["horizon_units"],
    )
    noise_first = next(n for n in model if n.metric == "TTFT, turn 1")
    assert noise_first.units is not None
    assert 0.5 < first["units"] / noise_first.units < 2.0, (first, noise_first)
