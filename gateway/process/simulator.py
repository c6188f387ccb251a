"""The built-in engine simulator as the live endpoint: the one place that decides when it runs.

With no live URL configured (`config.live.url` unset) `canary serve` proxies to a simulator
("baseline" profile) on 127.0.0.1. `needed` is that decision, and nothing else in the gateway
makes it: the data plane (`gateway.server`) always receives its live endpoint.

Where it runs follows the process model: with `--workers N` the supervisor starts one simulator
process (`simulator_process`) so every worker proxies to the same one and passes its URL down;
a single worker (or a test calling `runtime.running`) starts one in its own event loop
(`live_url`, when no URL was passed down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import AsyncIterator, Iterator

from domain.errors import ProcessDidNotStart
from gateway.config.sections import GatewayConfig
from gateway.lifecycle import die_with_parent, run_loop
from gateway.sim.server import start_sim

log = logging.getLogger("canary.gateway")

PROFILE = "baseline"
_STARTED = "no live endpoint configured: started the built-in engine simulator"


def needed(config: GatewayConfig) -> bool:
    """True when the gateway must run the built-in simulator as its live endpoint."""
    return config.live.url is None


@contextlib.asynccontextmanager
async def live_url(config: GatewayConfig, started: str | None = None) -> AsyncIterator[str]:
    """The live endpoint's URL for this process: the configured one; else `started` (the
    simulator a supervisor runs for every worker); else a simulator started here, in this event
    loop, and closed on exit."""
    if not needed(config):
        assert config.live.url is not None
        yield config.live.url
    elif started is not None:
        yield started
    else:
        async with await start_sim(PROFILE, host="127.0.0.1", port=0) as sim:
            log.info(_STARTED, extra={"fields": {"live_url": sim.url, "profile": PROFILE}})
            yield sim.url


@contextlib.contextmanager
def simulator_process(config: GatewayConfig, timeout_s: float = 30.0) -> Iterator[str | None]:
    """For a supervisor: one simulator process for every worker when `needed`, its URL (else
    None). Raises ProcessDidNotStart if it does not start within `timeout_s`; stopped on exit."""
    if not needed(config):
        yield None
        return
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_sim_main, args=(child_end, os.getpid()), name="canary-sim")
    proc.start()
    try:
        if not parent_end.poll(timeout_s):
            raise ProcessDidNotStart("the built-in engine simulator did not start")
        url: str = parent_end.recv()
        log.info(_STARTED, extra={"fields": {"live_url": url, "profile": PROFILE, "pid": proc.pid}})
        yield url
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _sim_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    die_with_parent(parent_pid)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with await start_sim(PROFILE, host="127.0.0.1", port=0) as sim:
            conn.send(sim.url)
            await stop.wait()

    run_loop(main())
