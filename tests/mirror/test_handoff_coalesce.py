"""The worker's hand-off writes its frames together (one socket write, one wake-up of the mirror
process, per few copies), and a copy whose frame was not yet written when the channel went down
is counted on the worker, not lost from the accounting (a real Unix socket, no mirror process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from multidict import CIMultiDict, CIMultiDictProxy

from domain.accounting import identity_holds
from domain.endpoint import Endpoint
from gateway.config.sections import GatewayConfig
from gateway.mirror.channel import frames
from gateway.mirror.channel.handoff import Handoff
from gateway.server.hooks import LiveTarget
from tests.waiting import SETTLE_S, until

CHAT = "/v1/chat/completions"


class _Peer(asyncio.Protocol):
    """Stands where the mirror process listens: records what arrives, one read at a time."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.connected = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.connected.set()

    def data_received(self, data: bytes) -> None:
        self.reads.append(data)


def _frames(data: bytes) -> list[int]:
    kinds, at = [], 0
    while at < len(data):
        kind, mlen, blen = frames.FRAME.unpack_from(data, at)
        kinds.append(kind)
        at += frames.FRAME.size + mlen + blen
    return kinds


async def _handoff(tmp_path: Path) -> tuple[Handoff, _Peer, asyncio.Server]:
    path = str(tmp_path / "plane.sock")
    peer = _Peer()
    server = await asyncio.get_running_loop().create_unix_server(lambda: peer, path)
    config = GatewayConfig()
    live = LiveTarget(config.live.endpoint("http://127.0.0.1:9"))
    handoff = Handoff(config.mirror, live, path, "w1", session_header="X-Session-ID")
    assert await handoff._connect()
    await peer.connected.wait()
    handoff.apply([Endpoint(name="c1", url="http://127.0.0.1:9", sample_rate=1.0)])
    return handoff, peer, server


def _request(handoff: Handoff, i: int) -> object | None:
    headers = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))
    body = b'{"model":"m","messages":[{"role":"user","content":"q%d"}]}' % i
    return handoff.on_request("POST", CHAT, headers, body, f"req-{i}")


async def test_frames_of_several_copies_arrive_in_one_write(tmp_path: Path) -> None:
    handoff, peer, server = await _handoff(tmp_path)
    try:
        tokens = [_request(handoff, i) for i in range(5)]
        assert all(isinstance(t, str) for t in tokens)
        for _ in range(3):  # loop iterations that poll the socket: an early write would arrive
            await asyncio.sleep(0)
        assert peer.reads == []  # nothing written yet: the frames wait for one write

        async def read() -> bool:
            return bool(peer.reads)

        await until(read, what="the frames written", within_s=SETTLE_S, every_s=0.005)
        await asyncio.sleep(0.02)  # a second write, were there one, would have arrived
        data = b"".join(peer.reads)
        assert _frames(data) == [frames.KIND_RELOAD] + [frames.KIND_COPY] * 5
        assert len(peer.reads) == 1, "the six frames were written (and read) apart"
        assert handoff.process["handed_off"] == 5
    finally:
        await handoff.close(0.1)
        server.close()


async def test_copies_not_yet_written_when_the_channel_drops_are_counted(tmp_path: Path) -> None:
    handoff, peer, server = await _handoff(tmp_path)
    try:
        for i in range(3):
            assert _request(handoff, i) is not None
        assert handoff._transport is not None
        handoff._transport.abort()  # the channel goes down before the frames are written
        await asyncio.sleep(0.05)
        row = handoff.counters()["c1"]
        assert row["sampled"] == 3 and row["dropped_overflow"] == 3
        assert identity_holds({**row, "pending": 0})
        assert b"".join(peer.reads) == b""  # none of them reached the mirror side
    finally:
        await handoff.close(0.1)
        server.close()
