"""The ramp's evidence path through the host's mirror process: a worker's `put_rollout` never waits
and drops (counted) when the channel is down or full, the mirror plane numbers each session's
turns in arrival order across workers and stamps its replica, and the records reach the
database through the plane's writer (real Unix sockets, a real plane, real SQLite)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.records import RolloutRecord, RolloutRequest
from gateway.config.load import load_config
from gateway.config.sections import GatewayConfig, MirrorConfig
from gateway.mirror.channel import frames
from gateway.mirror.channel.handoff import Handoff
from gateway.mirror.evidence import RolloutEvidence
from gateway.mirror.plane import serve_plane
from gateway.server.hooks import LiveTarget
from storage import queries
from storage.engine import make_engine, upgrade
from storage.reports.rollout import rollout_requests


def _request(
    generation: int,
    arm: int,
    session: int,
    *,
    error: str | None = None,
    ttft: float | None = 0.1,
    at: float = 1.0,
) -> RolloutRequest:
    return RolloutRequest(
        status=200, error_kind=error, ttft_s=ttft, e2e_s=1.0, finished=True,
        generation=generation, arm=arm, session=session, at=at,
    )  # fmt: skip


def _handoff(config: GatewayConfig, path: str, worker: str) -> Handoff:
    live = LiveTarget(config.live.endpoint("http://127.0.0.1:9"))
    return Handoff(config.mirror, live, path, worker, session_header="X-Session-ID")


async def test_put_rollout_drops_and_counts_when_the_channel_is_down_or_full(
    tmp_path: Path,
) -> None:
    """With no mirror process every record is `ramp_dropped`; with one that stopped reading,
    records fill the bounded channel (its cap plus the small-frame headroom), then are dropped
    and counted, and the call never waits."""
    path = str(tmp_path / "plane.sock")
    config = GatewayConfig(mirror=MirrorConfig(channel_max_bytes=4096))
    down = _handoff(config, path, "w0")
    for i in range(10):
        down.put_rollout(_request(7, i % 2, i))
    assert down.process["ramp_dropped"] == 10 and down.process["ramp_handed_off"] == 0

    peers: list[asyncio.Transport] = []
    connected = asyncio.Event()

    class Stalled(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.pause_reading()  # the mirror process stopped reading
            peers.append(transport)
            connected.set()

    server = await asyncio.get_running_loop().create_unix_server(Stalled, path)
    handoff = _handoff(config, path, "w1")
    try:
        assert await handoff._connect()
        await connected.wait()
        n = 60_000  # about 3 MiB of frames, past the 1 MiB + 4 KiB bound
        for i in range(n):
            handoff.put_rollout(_request(7, i % 2, i))
        sent, dropped = handoff.process["ramp_handed_off"], handoff.process["ramp_dropped"]
        assert sent + dropped == n and dropped > 0
        frame = frames.FRAME.size + frames.ROLLOUT_META.size
        assert sent * frame <= 4096 + (1 << 20)
    finally:
        await handoff.close(0.1)
        for peer in peers:
            peer.close()
        server.close()
        await server.wait_closed()


def test_turn_table_is_a_bounded_lru_that_counts_evictions() -> None:
    """Turns count per (generation, session) in arrival order; past the bound the least recently
    seen session is forgotten (counted) and, seen again, restarts at turn 1."""
    got: list[RolloutRecord] = []
    evidence = RolloutEvidence(got.append, "h1", turns_max=2)

    def send(generation: int, session: int) -> None:
        raw = frames.rollout_frame(_request(generation, 0, session, at=2.0))
        evidence.on_frame(raw[frames.FRAME.size :])

    for generation, session in ((2, 10), (2, 10), (4, 10), (2, 10), (2, 11), (4, 10)):
        send(generation, session)
    assert [(r.generation, r.session, r.turn) for r in got] == [
        (2, 10, 1),
        (2, 10, 2),
        (4, 10, 1),  # another rollout: its own turns
        (2, 10, 3),
        (2, 11, 1),  # evicts (4, 10), the least recently seen
        (4, 10, 1),
    ]
    assert evidence.counts == {"ramp_records": 6, "ramp_turns_evicted": 2}
    assert {r.replica for r in got} == {"h1"}


async def test_plane_numbers_turns_across_workers_and_stores_them(tmp_path: Path) -> None:
    """Two workers' RAMP frames reach a real mirror plane, which numbers each session's turns in
    arrival order (host-wide), stamps its replica and writes them: `rollout_requests` reads back
    what was sent, and the plane's frame events count the records."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}"
    config = load_config(
        None,
        environ={},
        overrides={
            "storage.db_url": url,
            "storage.writer_flush_interval_s": 0.05,
            "storage.registry_poll_interval_s": 0.2,
            "server.drain_timeout_s": 2.0,
            "mirror.priority": "normal",
        },
    )
    await upgrade(url)
    engine = make_engine(url)
    try:
        await _run_plane(config, engine, tmp_path)
    finally:
        await engine.dispose()


async def _run_plane(config: GatewayConfig, engine: AsyncEngine, tmp_path: Path) -> None:
    """Seed the live endpoint, run the plane with two workers' frames, stop it, read back."""
    await queries.seed(engine, Endpoint(name="live", url="http://127.0.0.1:9", role="live"))
    path = str(tmp_path / "plane.sock")
    stop = asyncio.Event()
    ready = asyncio.Event()
    plane = asyncio.create_task(serve_plane(config, path, "host-a", "normal", ready.set, stop))
    workers: list[Handoff] = []
    try:
        await asyncio.wait_for(ready.wait(), 10)
        for name in ("w1", "w2"):
            handoff = _handoff(config, path, name)
            await handoff.start()
            workers.append(handoff)
        # Session 5 alternates between the workers; each write is flushed before the next.
        sends = [(0, 5, 1), (1, 5, 1), (0, 6, 0), (1, 5, 1), (0, 6, 0), (0, 5, 1)]
        for at, (w, session, arm) in enumerate(sends):
            error = "timeout" if at == 3 else None
            ttft = None if error else 0.1 * (at + 1)
            request = _request(9, arm, session, error=error, ttft=ttft, at=100.0 + at)
            workers[w].put_rollout(request)
            await workers[w].wait_idle()  # the plane has read every frame before it
        stats = await workers[0].wait_stats()
        assert stats is not None and stats.process["ramp_records"] == len(sends)
        assert "ramp_records" in stats.prometheus
    finally:
        for handoff in workers:
            await handoff.close(1.0)
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(plane, 10)
    got = await rollout_requests(engine, 9, None, None)
    assert got["session"].tolist() == [5, 5, 6, 5, 6, 5]
    assert got["turn"].tolist() == [1, 2, 1, 3, 2, 4]
    assert got["arm"].tolist() == [1, 1, 0, 1, 0, 1]
    assert got["ok"].tolist() == [True, True, True, False, True, True]
    assert math.isnan(got["ttft_s"][3]) and got["ttft_s"][5] == 0.1 * 6
    async with engine.connect() as conn:
        replicas = await conn.execute(text("SELECT DISTINCT replica FROM rollout_requests"))
        assert replicas.scalars().all() == ["host-a"]
