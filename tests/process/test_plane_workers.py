"""`canary serve --workers 2`: one mirror process for the host. A session's turns reach the
candidate one at a time and in order whichever worker served them, the copy accounting
summed over the workers' and the mirror's stored rows is exact, and /metrics shows the whole
host whichever worker answers the scrape (real processes, real sockets, a real recording
candidate, real SQLite)."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from pathlib import Path

import aiohttp
import sqlalchemy as sa
from aiohttp import web

from domain.accounting import identity_holds
from storage import queries
from storage.engine import make_engine
from tests.process.test_serve_cli import start_serve, stop
from tests.server.test_metrics_exposition import parse_exposition
from tests.waiting import until

SESSIONS = 8
TURNS = 4


class _Recorder:
    """A candidate that records when each session's turn starts and ends."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[int, float, float]]] = {}

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        start = time.monotonic()
        await asyncio.sleep(0.03)  # long enough that two turns at once would overlap
        self.spans.setdefault(request.headers["X-Session-ID"], []).append(
            (turn, start, time.monotonic())
        )
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": "sim-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


async def _turn(url: str, session: int, turn: int) -> None:
    messages: list[dict[str, str]] = []
    for t in range(turn + 1):
        if t:
            messages.append({"role": "assistant", "content": f"a{t}"})
        messages.append({"role": "user", "content": f"s{session} t{t}"})
    # A new connection per turn: SO_REUSEPORT spreads the turns over both workers.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        payload = {"model": "sim-model", "messages": messages}
        headers = {"X-Session-ID": f"sess-{session}"}
        async with http.post(url + "/v1/chat/completions", json=payload, headers=headers) as r:
            assert r.status == 200
            await r.read()


def _requests_by_worker(text: str) -> dict[str, int]:
    """canary_proxy_requests_total summed per `worker` label, from one scrape."""
    out: dict[str, int] = {}
    for m in re.finditer(
        r'^canary_proxy_requests_total\{worker="(\d+)",[^}]*\} (\d+)$', text, re.M
    ):
        out[m[1]] = out.get(m[1], 0) + int(m[2])
    return out


async def _host_metrics(url: str, served: int) -> str:
    """/metrics on new connections (SO_REUSEPORT hands them to either worker) once every
    worker's view has caught up (each worker sends its series about once a second and the
    mirror process relays them with its STATS twice a second: a few periods are allowed);
    then every scrape, whichever worker answers it, must show the host: both workers'
    requests adding up to `served`, the same per worker each time, by the text-format rules."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def caught_up() -> bool:
            for _ in range(6):
                counts = _requests_by_worker(await _get(http, url))
                if set(counts) != {"0", "1"} or sum(counts.values()) != served:
                    return False
            return True

        await until(caught_up, what="both workers' requests in every scrape", within_s=15)
        scrapes = [await _get(http, url) for _ in range(12)]
    per_worker = [_requests_by_worker(text) for text in scrapes]
    assert all(p == per_worker[0] for p in per_worker), per_worker
    assert sum(per_worker[0].values()) == served and all(per_worker[0].values()), per_worker
    for text in scrapes:
        parse_exposition(text)  # each family headed once, its samples together, no series twice
        assert 'canary_mirror_channel_up{worker="0"} 1' in text
        assert 'canary_mirror_channel_up{worker="1"} 1' in text
    return scrapes[-1]


async def _get(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def test_session_turns_in_order_across_workers_and_exact_accounting(
    tmp_path: Path,
) -> None:
    """32 turns of 8 sessions through 2 workers: the candidate sees each session's turns in
    order and never two at once, the turns came through both workers, no turn is counted out
    of order, the stored accounting of all three processes sums to an exact identity, and
    every worker's /metrics shows both workers' series (`worker` label), not only its own."""
    recorder = _Recorder()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", recorder.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = tmp_path / "gateway.toml"
    config.write_text(
        "counters_flush_interval_s = 0.5\nregistry_poll_interval_s = 0.5\n"
        'mirror_priority = "normal"\n'  # the shared test host is saturated; priority has a test
        "[[candidates]]\n"
        f'name = "rec"\nurl = "http://127.0.0.1:{port}"\nsample_rate = 1.0\n'
        'sampling = "session"\nconcurrency = 4\n'
    )
    db = tmp_path / "canary.db"
    try:
        proc, url = await start_serve(tmp_path, "--workers", "2", "--config", str(config))
        try:
            for turn in range(TURNS):  # every session's turn t before any session's turn t+1
                await asyncio.gather(*(_turn(url, s, turn) for s in range(SESSIONS)))
            async with asyncio.timeout(60):
                while sum(len(v) for v in recorder.spans.values()) < SESSIONS * TURNS:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            text = await _host_metrics(url, SESSIONS * TURNS)
            assert "canary_mirror_out_of_order_turns_total 0" in text
            assert re.search(r"^canary_mirror_split_sessions_total\{[^}]*\} 0$", text, re.M)
        finally:
            code, err = await stop(proc)
        assert code == 0, err
    finally:
        await runner.cleanup()
    for session, spans in recorder.spans.items():
        assert [t for t, _, _ in spans] == list(range(TURNS)), session
        for (_, _, end), (_, start, _) in itertools.pairwise(spans):
            assert start >= end, f"{session}: two turns at once"
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    try:
        totals = (await queries.sum_counters(engine))["rec"]
        async with engine.connect() as conn:
            replicas = (await conn.execute(sa.text("SELECT DISTINCT replica FROM exchanges"))).all()
            rows = (await conn.execute(sa.text("SELECT replica FROM mirror_counters"))).all()
    finally:
        await engine.dispose()
    # The exchanges name the host's mirror process, whichever worker served production: turns
    # of one session served by both workers are not a split session.
    assert len(replicas) == 1 and "-mirror-" in replicas[0][0]
    assert len(rows) == 3 and sum("-mirror-" in r[0] for r in rows) == 1
    totals.setdefault("pending", 0)
    assert identity_holds(totals)
    assert totals["sampled"] == totals["observed_ok"] == SESSIONS * TURNS
