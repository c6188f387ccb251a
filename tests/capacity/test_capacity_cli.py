"""`canary capacity` end to end on the simulator: conversations captured by a real gateway into
SQLite, replayed by the command against a candidate and its control, the result printed in
each format and stored; bad input gets a message and exit code 2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim
from gateway.sim.workload import WorkloadSpec, run_workload
from storage.capacity.runs import latest_capacity
from storage.engine import make_engine

pytestmark = pytest.mark.slow


async def _capture(db: str, sims: dict[str, SimServer], *, capture: bool = True) -> None:
    """Eight three-turn conversations through a gateway that mirrors them to `cand` and the
    control, capturing them (or not)."""
    candidates = [
        {"name": "cand", "url": sims["cand"].url, "sample_rate": 1.0, "sampling": "session",
         "price_per_hour_usd": 3.0},
        {"name": "ctl", "url": sims["ctl"].url, "kind": "control", "sample_rate": 1.0,
         "sampling": "session", "price_per_hour_usd": 2.0},
    ]  # fmt: skip
    config = load_config(
        None,
        environ={},
        overrides={
            "listen": "127.0.0.1:0",
            "live_url": sims["live"].url,
            "db_url": db,
            "mirror_shed_loop_lag_ms": 500.0,
            "mirror_shed_cpu_busy": 0.0,
            "capture": capture,
            "capture_share": 1.0,
            "candidates": candidates,
        },
    )
    async with running(config) as parts:
        spec = WorkloadSpec(sessions=8, turns=3, concurrency=4, seed=5, tools_every=0)
        await run_workload(parts.url, spec)
        await parts.mirror.wait_idle()


async def _sims() -> dict[str, SimServer]:
    fast = {"time_scale": 0.05}
    return {
        "live": await start_sim(get_profile("baseline", **fast)),
        "cand": await start_sim(get_profile("quantized", **fast)),
        "ctl": await start_sim(get_profile("control", **fast)),
    }


async def test_capacity_command_measures_stores_and_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On captured conversations the command ramps both arms, prints text, JSON and HTML with
    both arms' steps, and stores each result so the newest one is what the report reads."""
    db = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    sims = await _sims()
    try:
        await _capture(db, sims)
        base = ["capacity", "cand", "--db", db, "--slo", "ttft=2s", "--loads", "1,2",
                "--step-seconds", "0.5", "--bootstrap", "50"]  # fmt: skip
        assert await asyncio.to_thread(main, base) == 0
        text = capsys.readouterr().out
        assert "candidate cand" in text and "reference ctl" in text and "per step" in text
        out = tmp_path / "c.json"
        assert await asyncio.to_thread(main, [*base, "--format", "json", "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert [s["load"] for s in doc["candidate"]["steps"]] == [1, 2]
        assert doc["reference"]["endpoint"] == "ctl" and doc["reference"]["usd_per_hour"] == 2.0
        assert doc["candidate"]["steps"][0]["requests"] > 0
        html = tmp_path / "c.html"
        assert await asyncio.to_thread(main, [*base, "--format", "html", "--out", str(html)]) == 0
        assert html.read_text().count("<svg") == 5
        engine = make_engine(db)
        try:
            stored = await latest_capacity(engine, "cand")
        finally:
            await engine.dispose()
        assert stored is not None and stored.reference == "ctl" and stored.slo == "ttft<=2s"
        assert json.loads(stored.result_json)["candidate"]["steps"][0]["load"] == 1
        assert stored.capacity is not None and stored.usd_per_1m_tokens is not None
    finally:
        await asyncio.gather(*(s.close() for s in sims.values()))


async def test_bad_input_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown candidate, an SLO that does not parse, bad loads, no captured sessions, a bad
    reference URL, no reference, and the live endpoint as an arm each end with one message and
    exit code 2."""
    db = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    sims = await _sims()
    try:
        await _capture(db, sims, capture=False)
        cases = [
            (["capacity", "ghost", "--db", db], "unknown candidate 'ghost'"),
            (["capacity", "cand", "--db", db, "--slo", "ttft=soon"], "'ttft=soon'"),
            (["capacity", "cand", "--db", db, "--loads", "4,2"], "--loads"),
            (["capacity", "cand", "--db", db], "no captured sessions"),
            (["capacity", "cand", "--db", db, "--reference", "ftp://x"], "--reference"),
            (["capacity", "ctl", "--db", db], "has no control"),
            (["capacity", "ctl", "--db", db, "--reference", sims["live"].url], "live endpoint"),
        ]
        for argv, message in cases:
            assert await asyncio.to_thread(main, argv) == 2, argv
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err, (argv, err)
    finally:
        await asyncio.gather(*(s.close() for s in sims.values()))
