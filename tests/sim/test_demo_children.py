"""The demo's children: a simulator started on port 0 says where it listens, and the demo takes
its URL from that line, so two simulators never race for one port picked in advance."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from domain.errors import CanaryError
from gateway.process.demo.children import Processes, wait_announced


async def test_simulators_on_port_zero_announce_distinct_urls_that_answer(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    try:
        for name in ("a", "b", "c"):
            await procs.start(name, "sim", "--port", "0", "--profile", "baseline")
        urls = [await wait_announced(procs.get(n), n, tmp_path / f"{n}.log") for n in "abc"]
        assert len(set(urls)) == 3, urls
        async with aiohttp.ClientSession() as http:
            for url in urls:
                async with http.get(f"{url}/health") as resp:
                    assert resp.status == 200
    finally:
        await procs.stop_all()
    assert all(p.returncode is not None for _, p in procs.children)


async def test_a_simulator_that_exits_before_it_listens_is_a_clear_error(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    try:
        proc = await procs.start("bad", "sim", "--port", "0", "--profile", "no-such-profile")
        with pytest.raises(CanaryError, match=r"bad exited with code 2:\n.*no-such-profile"):
            await wait_announced(proc, "bad", tmp_path / "bad.log")
    finally:
        await procs.stop_all()
