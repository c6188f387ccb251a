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
from evaluators.judge.preference_plan import preference_plan
from evaluators.judge.settings import STRICT, VerdictSettings
from gateway.config.load import load_config
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


def _experiment(url: str, kind: str, scored_every: int = 0) -> None:
    """Store 120 three-turn sessions drawn from the independent world at real engines' noise as
    the pairs so far of candidate `cand` (of `kind`) and its control; with `scored_every`, every
    such pair carries both arms' logprob scores (as teacher forcing writes them)."""
    import msgspec

    from bench._shared import world
    from domain.endpoint import Endpoint
    from storage import queries
    from storage.engine import make_engine, upgrade
    from tests.evaluators.test_eval_pairs import store

    case = next(c for c in world.PLANNED if c.label.startswith("A/A bi-kv, real"))
    pairs = world.draw(case.world, 120, np.random.default_rng(3))
    t0 = time.time() - 3600
    pairs = [msgspec.structs.replace(p, received_at=t0 + p.received_at) for p in pairs]
    for i, p in enumerate(pairs):
        if scored_every and i % scored_every == 0 and p.candidate and p.control:
            score = {"score_tokens": 40, "score_logprob": -0.4, "score_kl": 0.003}
            cand = msgspec.structs.replace(p.candidate, score_top1=0.95 + 0.01 * (i % 3), **score)
            ctrl = msgspec.structs.replace(p.control, score_top1=0.96, **score)
            pairs[i] = msgspec.structs.replace(p, candidate=cand, control=ctrl)

    async def setup() -> None:
        await upgrade(url)
        engine = make_engine(url)
        try:
            await queries.create_endpoint(
                engine, Endpoint(name="live", url="http://l", role="live")
            )
            for name, k in (("cand", kind), ("ctrl", "control")):
                ep = Endpoint(
                    name=name, url="http://c", kind=k, sampling="session",
                    verdict=dict(world.REAL_MARGINS),
                )  # fmt: skip
                await queries.create_endpoint(engine, ep)
            await store(engine, pairs)
        finally:
            await engine.dispose()

    asyncio.run(setup())


def test_plan_from_a_running_experiment_measures_each_gating_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`canary plan --candidate` reads the candidate's pairs so far (here 120 three-turn sessions
    drawn from the independent world at real engines' noise): one row per gating test as the
    verdict gates it, turn-1 TTFT apart from the later-turn goal, sized from the noise each
    showed — the turn-1 row, one noisy pair per session, needs the most sessions of the latency
    rows and about what the noise model says at a pair sd of 1.1."""
    from bench._shared import world
    from gateway.cli.main import main

    url = f"sqlite+aiosqlite:///{tmp_path / 'plan.db'}"
    _experiment(url, "bi-kv")
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
    # A bi-kv candidate scores nothing: no divergence row (--score-rate's default is the noise
    # model's, not a running candidate's).
    assert not [r for r in doc["needs"] if "divergence" in r["metric"]]
    sized = [r["units"] for r in doc["needs"]]
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


def test_plan_of_a_scoring_candidate_lists_its_divergence_test_once_in_a_narrow_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`canary plan --candidate` of a quantized candidate that scored one pair in ten lists the
    divergence test once, sized on that measured share of scored pairs, and its table keeps
    every column aligned within a 60-column terminal, cutting long test names."""
    from gateway.cli.main import main

    url = f"sqlite+aiosqlite:///{tmp_path / 'plan.db'}"
    _experiment(url, "quantized", scored_every=10)
    base = ["plan", "--candidate", "cand", "--db", url, "--since", "2h"]
    assert main([*base, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = [r for r in doc["needs"] if "divergence" in r["metric"]]
    share = 36 / 360  # every 10th of 360 pairs scored
    assert row["metric"].startswith(f"logprob divergence ({share:g} scored)")
    assert row["pairs"] == math.ceil(row["units"] / share)
    monkeypatch.setenv("COLUMNS", "60")
    assert main(base) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("") + 1
    table = out[start : out.index("", start)]
    assert table[0].split() == ["test", "margin", "sessions", "pairs", "time"]
    assert len(table) == len(doc["needs"]) + 1
    assert sum("divergence" in line for line in table) == 1
    assert any("…" in line for line in table)  # the longest names were cut, not the layout
    assert all(len(line) <= 60 for line in table)
    # Right-aligned numbers: every row's pairs column ends where the header's does.
    end = table[0].index("pairs") + len("pairs")
    for line, r in zip(table[1:], doc["needs"], strict=True):
        assert line[:end].endswith(f"{r['pairs']:,}"), line


async def test_plan_states_each_rollout_step_at_the_live_session_rate() -> None:
    """`canary plan` states each default ramp step's sessions, time and what sizes it at the
    live session rate (1 %: a smoke step of min_step_s; 5 %: the TTFT harm; 25 %: the failure
    harm; 50 %: the non-inferiority look; 100 %: its dwell), the whole ramp's time as their sum,
    and a bad noise or failing share is refused with exit 2."""
    code, out, err = await canary("plan", "--rate", "60", "--turns", "6", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    steps = doc["ramp"]
    assert [r["weight"] for r in steps] == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert [r["sized_by"] for r in steps] == [
        "min_step_s", "TTFT harm", "failure harm", "non-inferiority", "min_step_s",
    ]  # fmt: skip
    for r in steps[1:4]:
        assert math.isclose(r["seconds"], max(60.0, r["sessions"] / (60 / 6)), rel_tol=0.01)
    assert math.isclose(doc["ramp_seconds"], sum(r["seconds"] for r in steps), rel_tol=1e-9)
    code, out, _ = await canary("plan", "--rate", "60", "--turns", "6")
    assert code == 0 and "the whole ramp: about" in out and "50 %" in out
    code, _, err = await canary("plan", "--rate", "60", "--failing-share", "0.7")
    assert code == 2 and "--failing-share" in err
    code, _, err = await canary("plan", "--rate", "60", "--session-noise", "-1")
    assert code == 2 and "--session-noise" in err


@pytest.mark.slow  # simulates the graded plan: ~30 s on two cores
async def test_graded_plan_states_sessions_time_and_cost() -> None:
    """`--graded` states, for the preference margin and twice and three times it, the graded
    sessions the sizing core finds, the time at the sampled session rate, the grader calls at
    the swap rate and their cost; bad grader flags exit 2 naming the flag."""
    code, out, err = await canary(
        "plan", "--rate", "20", "--sample-rate", "0.5", "--turns", "1", "--graded",
        "--grader-price", "1",
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["graded"]
    assert [r["margin"] for r in rows] == pytest.approx([0.05, 0.10, 0.15])
    (core,) = preference_plan((0.05,), alpha=0.05, price_per_mtok=1.0)
    assert rows[0]["sessions"] == core.sessions and rows[0]["cost_usd"] == core.cost_usd
    assert rows[0]["seconds"] == pytest.approx(core.sessions / 10.0)  # type: ignore[operator]
    assert rows[0]["sessions"] > rows[1]["sessions"] > rows[2]["sessions"]
    code, out, err = await canary("plan", "--rate", "20", "--graded")
    assert code == 0 and "graded sessions" in out and "-5 pp" in out, err
    for args, flag in (
        (("--grader-sd", "2"), "--grader-sd"),
        (("--swap-rate", "-1"), "--swap-rate"),
        (("--preference-delta", "0"), "--preference-delta"),
    ):
        code, _out, err = await canary("plan", "--rate", "5", "--graded", *args)
        assert code == 2 and flag in err and "Traceback" not in err, (args, err)
