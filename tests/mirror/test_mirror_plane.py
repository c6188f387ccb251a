"""The mirror process: copies leave the worker through a bounded non-blocking channel, the
accounting is exact across the worker's and the mirror's rows, the memory budget counts
headers, the worker never parses a body, and a dead mirror process is restarted while
production carries on (real gateway, real mirror process, real sockets, real SQLite)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from domain.accounting import identity_holds
from gateway.config.load import load_config
from gateway.config.sections import GatewayConfig
from gateway.process.runtime import running
from gateway.sim.server import start_sim
from storage import queries
from storage.engine import make_engine

CHAT = "/v1/chat/completions"


def _config(tmp: Path, **overrides: object) -> GatewayConfig:
    base: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "storage.db_url": f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
        "admin.insecure": True,
        "server.drain_timeout_s": 2.0,
        "storage.counters_flush_interval_s": 0.2,
        "storage.registry_poll_interval_s": 0.2,
        # The shared test machine runs near saturation: at idle priority the mirror process
        # would get almost no CPU and these tests (about accounting, not priority) would crawl.
        "mirror.priority": "normal",
    }
    return load_config(None, environ={}, overrides={**base, **overrides})


def _body(i: int, pad: int = 0) -> dict[str, Any]:
    # The padding is a field the simulator ignores: a long prompt would make it slow to answer.
    messages = [{"role": "user", "content": f"q{i}"}]
    return {"model": "sim-model", "messages": messages, "metadata": {"pad": "x" * pad}}


async def _metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.slow  # ~26 s on two cores
async def test_stalled_mirror_process_costs_production_nothing_and_is_counted(
    tmp_path: Path,
) -> None:
    """With the mirror process stopped (SIGSTOP), every production request is still answered,
    copies past the channel bound are `dropped_overflow` on the worker, and after it resumes
    the worker's and the mirror's stored rows sum to an exact accounting identity."""
    async with await start_sim("fast") as cand:
        config = _config(
            tmp_path,
            mirror_channel_max_bytes=64 * 1024,
            candidates=[{"name": "c1", "url": cand.url, "sample_rate": 1.0}],
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            assert parts.plane is not None and parts.plane.pid is not None
            os.kill(parts.plane.pid, signal.SIGSTOP)
            try:
                for i in range(60):
                    async with http.post(parts.url + CHAT, json=_body(i, 12_000)) as resp:
                        assert resp.status == 200
                        await resp.read()
            finally:
                os.kill(parts.plane.pid, signal.SIGCONT)
            worker = parts.mirror.counters()["c1"]
            assert (
                worker["dropped_overflow"] > 0 and worker["sampled"] == worker["dropped_overflow"]
            )
            await parts.mirror.wait_idle()
        # Both processes have saved their final rows on the way out.
        engine = make_engine(config.storage.db_url)
        try:
            totals = await queries.sum_counters(engine)
        finally:
            await engine.dispose()
    c1 = {k: totals["c1"].get(k, 0) for k in (*totals["c1"], "pending")}
    assert c1["sampled"] == 60
    assert identity_holds(c1)
    assert c1["observed_ok"] > 0 and c1["pending"] == 0


async def test_oversize_body_is_never_copied_nor_parsed(tmp_path: Path) -> None:
    """A body larger than the channel bound is `dropped_oversize` on the worker before a byte
    is copied, and production gets its answer as usual."""
    async with await start_sim("fast") as cand:
        config = _config(
            tmp_path,
            mirror_channel_max_bytes=256 * 1024,
            candidates=[{"name": "c1", "url": cand.url, "sample_rate": 1.0}],
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            async with http.post(parts.url + CHAT, json=_body(0, 400_000)) as resp:
                assert resp.status == 200
            row = parts.mirror.counters()["c1"]
            assert row["sampled"] == row["dropped_oversize"] == 1
            assert parts.mirror.process["handed_off"] == 0


async def test_worker_decides_session_samples_without_reading_the_body(tmp_path: Path) -> None:
    """With the session header present, the worker samples and hands off a copy whose body is
    not even JSON (it never parses it); the mirror process is the one that finds it unparseable."""
    async with await start_sim("fast") as cand:
        config = _config(
            tmp_path,
            candidates=[{"name": "c1", "url": cand.url, "sample_rate": 1.0, "sampling": "session"}],
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            headers = {"X-Session-ID": "s1", "Content-Type": "application/json"}
            async with http.post(parts.url + CHAT, data=b"not json", headers=headers) as resp:
                await resp.read()
            assert parts.mirror.process["handed_off"] == 1
            await parts.mirror.wait_idle()
            stats = await parts.mirror.wait_stats()
            assert stats is not None and stats.process["skipped_unparseable"] == 1


async def test_big_headers_with_a_hung_candidate_stay_in_the_budget(tmp_path: Path) -> None:
    """Copies with ~96 KiB of headers each, to a hung candidate under a 1 MiB budget: the
    budget holds and `canary_mirror_memory_bytes` counts the headers the queued copies hold."""
    budget = 1024 * 1024
    async with await start_sim("hang") as hung:
        config = _config(
            tmp_path,
            mirror_memory_budget_bytes=budget,
            candidates=[
                {
                    "name": "hung",
                    "url": hung.url,
                    "sample_rate": 1.0,
                    "concurrency": 1,
                    "timeout_s": 60.0,
                }
            ],
        )
        big = {f"X-Pad-{i}": "h" * 8000 for i in range(12)}  # 12 x 8 KB: ~96 KiB a request
        async with running(config) as parts, aiohttp.ClientSession() as http:
            for i in range(24):
                async with http.post(parts.url + CHAT, json=_body(i), headers=big) as resp:
                    assert resp.status == 200
            await parts.mirror.wait_stats()
            await parts.mirror.wait_stats()
            used = await _metric(http, parts.url, "canary_mirror_memory_bytes")
            c = parts.mirror.host_counters()["hung"]
        assert used <= budget
        # Everything queued is charged with its headers: at least 96 KB a queued copy.
        assert c["buffer_items"] >= 5 and used >= c["buffer_items"] * 96_000
        # What the budget could not hold was dropped, or shed by the workers once the lane's full
        # ring lowered its capacity share (gateway.mirror.sampling.capacity).
        assert c["dropped_overflow"] + c["shed_overload"] > 0


async def test_dead_mirror_process_is_restarted_and_production_carries_on(
    tmp_path: Path,
) -> None:
    """SIGKILL of the mirror process: production answers every request meanwhile, the worker
    restarts it, reconnects, copies flow again, and the priority it got is exported."""
    async with await start_sim("fast") as cand:
        config = _config(tmp_path, candidates=[{"name": "c1", "url": cand.url, "sample_rate": 1.0}])
        async with running(config) as parts, aiohttp.ClientSession() as http:
            assert parts.plane is not None and parts.plane.pid is not None
            first = parts.plane.pid
            async with http.get(parts.url + "/metrics") as resp:
                text = await resp.text()
            assert 'canary_mirror_process_info{pid="' in text and "priority=" in text
            os.kill(first, signal.SIGKILL)
            for i in range(20):
                async with http.post(parts.url + CHAT, json=_body(i)) as resp:
                    assert resp.status == 200
            async with asyncio.timeout(60):
                while parts.plane.pid == first:  # noqa: ASYNC110 - a process, no event to wait on
                    await asyncio.sleep(0.1)
                while parts.mirror.process["handed_off"] == 0 or not (
                    await _metric(http, parts.url, "canary_mirror_channel_up")
                ):
                    async with http.post(parts.url + CHAT, json=_body(99)) as resp:
                        assert resp.status == 200
                    await asyncio.sleep(0.1)
            assert await _metric(http, parts.url, "canary_mirror_process_restarts_total") == 1


class _Dispatched:
    """Stands in for the plane's `dispatch` (what `_Plane._frames` calls per frame)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes, bytes]] = []

    def dispatch(self, kind: int, meta: bytes, body: bytes, writer: object) -> None:
        if meta == b"bad":
            raise msgspec.DecodeError("malformed")
        self.seen.append((kind, meta, body))


def test_frames_are_dispatched_once_in_order_however_the_reads_split_them() -> None:
    """The plane parses every complete frame a read brings: a stream of frames cut at any
    byte (or arriving whole) dispatches each frame once, in order, with its meta and body;
    a malformed one is dropped and the next is still read."""
    from gateway.mirror.channel import frames
    from gateway.mirror.plane import _Plane

    sent = [
        (frames.KIND_COPY, b"meta-1", b'{"body": 1}'),
        (frames.KIND_RESULT, b"r1", b""),
        (frames.KIND_COPY, b"bad", b"x"),
        (frames.KIND_IDLE, b"\x01", b""),
        (frames.KIND_COPY, b"meta-2", b"b" * 1000),
    ]
    wire = b"".join(frames.frame_header(k, len(m), len(b)) + m + b for k, m, b in sent)
    expected = [f for f in sent if f[1] != b"bad"]
    for cut in (1, 2, 7, 9, 10, 64, len(wire)):
        stub = _Dispatched()
        buf = bytearray()
        for start in range(0, len(wire), cut):  # what handle() does with each read
            buf += wire[start : start + cut]
            with memoryview(buf) as view:
                done = _Plane._frames(stub, view, None)  # type: ignore[arg-type]
            del buf[:done]
        assert stub.seen == expected, cut
        assert not buf
