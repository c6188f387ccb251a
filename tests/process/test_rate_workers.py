"""`target_rps` end to end: `canary serve --workers 2` (two workers, one mirror process) in
front of a fast live endpoint, ~200 req/s offered, three recording candidates. The controller
converges, never samples above `sample_rate`, keeps samples nested across targets, and both
workers apply the same share (real processes, real sockets, real SQLite)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import aiohttp
import sqlalchemy as sa
import xxhash
from aiohttp import web

from gateway.mirror.sampling.sampler import SALT
from storage.engine import make_engine
from tests.process.test_serve_cli import start_serve, stop

OFFERED_RPS = 200
LOAD_S = 26.0
SETTLED_S = 12.0  # the window [SETTLED_S, LOAD_S] is measured (the climb takes ~5 s)
CLIENTS = 24
TOLERANCE = 0.30  # realized vs target over ~14 s: Poisson noise, the +-10 % band, a busy host
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class _Upstreams:
    """The live endpoint (answers at once) and the candidates (record each copy's id)."""

    def __init__(self) -> None:
        self.copies: dict[str, list[str]] = {"high": [], "low": [], "capped": []}

    async def live(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    async def candidate(self, request: web.Request) -> web.Response:
        await request.read()
        self.copies[request.match_info["name"]].append(request.headers["X-Request-ID"])
        return web.json_response(ANSWER)


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _h(rid: str) -> float:
    return xxhash.xxh3_64_intdigest(SALT + rid.encode()) / float(2**64)


async def _load(url: str, sent: dict[str, float], stop_at: float) -> None:
    """~OFFERED_RPS requests a second on a fixed schedule, over CLIENTS keep-alive connections
    (SO_REUSEPORT spreads them over both workers)."""
    counter = itertools.count()
    start = time.monotonic()

    async def client() -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                i = next(counter)
                due = start + i / OFFERED_RPS
                if due >= stop_at:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                rid = f"r{i}"
                body = {"model": "m", "messages": [{"role": "user", "content": f"q {i}"}]}
                async with http.post(
                    url + "/v1/chat/completions", json=body, headers={"X-Request-ID": rid}
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
                sent[rid] = time.monotonic() - start

    await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def _both_workers_listen(url: str) -> None:
    """Workers come up one after the other: the load's connections must reach both."""
    pids: set[int] = set()
    async with asyncio.timeout(60):
        while len(pids) < 2:
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.get(url + "/healthz") as resp,
            ):
                pids.add((await resp.json())["pid"])


async def _worker_shares(url: str, name: str) -> dict[str, tuple[float, float]]:
    """Each worker's (share it applies, the host's share) for `name`, by worker, asking over
    new connections until both workers answered with one value (a change of the share between
    two answers starts over; a worker that kept another share would time the test out)."""
    seen: dict[str, tuple[float, float]] = {}
    async with asyncio.timeout(20):
        while len(seen) < 2 or len({v for pair in seen.values() for v in pair}) > 1:
            if len(seen) == 2:
                seen.clear()
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.get(f"{url}/admin/candidates/{name}") as resp,
            ):
                rate = (await resp.json())["rate"]
            seen[rate["worker"]] = (rate["worker_sample_rate"], rate["effective_sample_rate"])
    return seen


async def _metric(url: str, line_start: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(line_start + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not exported")


async def test_target_rps_across_two_workers(tmp_path: Path) -> None:
    """Offered ~200 req/s for 26 s: `high` (target 20/s) and `low` (8/s) realize their targets
    within 30 % once settled, and the mirror's gauge agrees; `capped` (target 1000/s under
    sample_rate 0.05) receives exactly the requests hashed below 0.05 — never more — whichever
    worker served them; `low`'s copies are a subset of `high`'s; both workers served mirrored
    requests and apply the host's share at the same moment."""
    ups = _Upstreams()
    live = web.Application()
    live.router.add_post("/v1/chat/completions", ups.live)
    cands = web.Application()
    cands.router.add_post("/{name}/v1/chat/completions", ups.candidate)
    (live_runner, live_port), (cand_runner, cand_port) = await _serve(live), await _serve(cands)
    config = tmp_path / "gateway.toml"
    table = "[[candidates]]\nname = '{}'\nurl = 'http://127.0.0.1:{}/{}'\n{}\n"
    common = "concurrency = 16\nbuffer_max_items = 100000"
    config.write_text(
        "counters_flush_interval_s = 0.5\nregistry_poll_interval_s = 0.5\n"
        'mirror_priority = "normal"\n'  # the test host is shared; priority has its own test
        "mirror_shed_cpu_busy = 0.0\nmirror_shed_loop_lag_ms = 60000.0\n"  # shedding: own tests
        + table.format("high", cand_port, "high", f"target_rps = 20.0\nsample_rate = 1.0\n{common}")
        + table.format("low", cand_port, "low", f"target_rps = 8.0\nsample_rate = 1.0\n{common}")
        + table.format(
            "capped", cand_port, "capped", f"target_rps = 1000.0\nsample_rate = 0.05\n{common}"
        )
    )
    sent: dict[str, float] = {}
    try:
        proc, url = await start_serve(
            tmp_path, "--workers", "2", "--config", str(config), "--insecure-admin",
            "--live", f"http://127.0.0.1:{live_port}",
        )  # fmt: skip
        try:
            await _both_workers_listen(url)
            start = time.monotonic()
            load = asyncio.create_task(_load(url, sent, start + LOAD_S))
            await asyncio.sleep(LOAD_S - 4)
            shares = await _worker_shares(url, "high")
            gauge = await _metric(url, 'canary_mirror_realized_copies_per_second{candidate="high"}')
            capped_share = await _metric(
                url, 'canary_mirror_effective_sample_rate{candidate="capped"}'
            )
            await load
            async with asyncio.timeout(30):  # the last copies reach the candidates
                expected_capped = {r for r in sent if _h(r) < 0.05}
                while set(ups.copies["capped"]) < expected_capped:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
        finally:
            code, err = await stop(proc)
        assert code == 0, err
    finally:
        await live_runner.cleanup()
        await cand_runner.cleanup()

    window = [r for r, t in sent.items() if SETTLED_S <= t < LOAD_S]
    offered = len(window) / (LOAD_S - SETTLED_S)
    assert offered > 100, f"the host offered only {offered:.0f} req/s"
    for name, target in (("high", 20.0), ("low", 8.0)):
        got = set(ups.copies[name])
        realized = sum(1 for r in window if r in got) / (LOAD_S - SETTLED_S)
        assert abs(realized - target) <= TOLERANCE * target, (name, realized, offered)
    assert abs(gauge - 20.0) <= TOLERANCE * 20.0, gauge

    assert capped_share == 0.05
    assert set(ups.copies["capped"]) == expected_capped  # exactly the ceiling, both workers
    assert set(ups.copies["low"]) <= set(ups.copies["high"])  # nested across targets

    (w1, h1), (w2, h2) = shares.values()
    assert w1 == w2 == h1 == h2, shares  # every worker applies the host's share
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}")
    try:
        async with engine.connect() as conn:
            replicas = (await conn.execute(sa.text("SELECT DISTINCT replica FROM exchanges"))).all()
    finally:
        await engine.dispose()
    # Exchanges are stored under the host's mirror process, whichever worker served them (one
    # mirror keeps a session's turns in order, so two workers of a host are never a split);
    # both workers answered (`shares` above holds two workers).
    assert len(replicas) == 1 and replicas[0][0].split("-")[-2] == "mirror", replicas
