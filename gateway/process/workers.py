"""The process model of `canary serve`: one event loop per process, N processes on one port.

`serve_forever` runs the gateway in this process when `workers == 1`; otherwise the parent
becomes a supervisor: it reserves the port, starts one built-in simulator process when no live
endpoint is configured (so every worker proxies to the same one), spawns N workers that bind the
port with SO_REUSEPORT, restarts a worker that dies (within a budget), and forwards SIGTERM/SIGINT
to its children. uvloop is used when installed, asyncio's default loop otherwise.

The supervisor must never serve traffic itself and never leave a child running when it exits.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Coroutine
from multiprocessing.process import BaseProcess
from typing import Any

import msgspec

from gateway.process.config import GatewayConfig, split_host_port

log = logging.getLogger("canary.supervisor")

# A worker dying more often than this is a crash loop: the supervisor stops everything.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` to completion on uvloop when installed, else on asyncio's default loop."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is optional
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def serve_forever(config: GatewayConfig) -> int:
    """Run `canary serve` with this config until SIGTERM/SIGINT; returns the exit code."""
    if config.workers == 1:
        from gateway.process.runtime import serve_until_stopped

        run_loop(serve_until_stopped(config))
        return 0
    return _supervise(config)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGTERM this child when its parent dies (Linux), so a supervisor (or the
    demo) killed with SIGKILL or by the OOM killer never leaves children holding ports."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _worker_main(
    config: GatewayConfig, index: int, parent_pid: int, simulator_url: str | None
) -> None:
    die_with_parent(parent_pid)
    from gateway.process.logs import setup_logging
    from gateway.process.runtime import serve_until_stopped

    setup_logging(config.log_format, config.log_level)
    run_loop(serve_until_stopped(config, simulator_url=simulator_url))


def _sim_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    die_with_parent(parent_pid)

    async def main() -> None:
        from gateway.sim.server import start_sim

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with await start_sim("baseline", host="127.0.0.1", port=0) as sim:
            conn.send(sim.url)
            await stop.wait()

    run_loop(main())


def _reserve_port(host: str) -> socket.socket:
    """Bind (without listening) a SO_REUSEPORT socket on a free port, so workers can share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


def _supervise(config: GatewayConfig) -> int:
    ctx = multiprocessing.get_context("spawn")
    children: list[BaseProcess] = []
    sim: BaseProcess | None = None
    simulator_url: str | None = None
    reserved: socket.socket | None = None
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in [*children, sim]:
            if proc is not None and proc.is_alive():
                proc.terminate()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if config.live_url is None:
            parent_end, child_end = ctx.Pipe(duplex=False)
            sim = ctx.Process(target=_sim_main, args=(child_end, os.getpid()), name="canary-sim")
            sim.start()
            if not parent_end.poll(30.0):
                log.error("the built-in engine simulator did not start")
                return 1
            url = parent_end.recv()
            log.info(
                "no live endpoint configured: started the built-in engine simulator",
                extra={"fields": {"live_url": url, "profile": "baseline", "pid": sim.pid}},
            )
            simulator_url = url
        from gateway.process.runtime import prepare_storage

        run_loop(prepare_storage(config))
        host, port = split_host_port(config.listen)
        if port == 0:
            reserved = _reserve_port(host)
            port = reserved.getsockname()[1]
            config = msgspec.structs.replace(config, listen=f"[{host}]:{port}")

        def spawn(index: int) -> BaseProcess:
            proc = ctx.Process(
                target=_worker_main,
                args=(config, index, os.getpid(), simulator_url),
                name=f"canary-worker-{index}",
            )
            proc.start()
            return proc

        children.extend(spawn(i) for i in range(config.workers))
        log.info(
            "supervising workers",
            extra={"fields": {"workers": config.workers, "pids": [c.pid for c in children]}},
        )
        restarts: deque[float] = deque()
        while not stopping:
            multiprocessing.connection.wait([c.sentinel for c in children], timeout=1.0)
            if stopping:
                break
            for i, child in enumerate(children):
                if child.is_alive():
                    continue
                now = time.monotonic()
                while restarts and now - restarts[0] > RESTART_WINDOW_S:
                    restarts.popleft()
                if len(restarts) >= MAX_RESTARTS:
                    log.error(
                        "workers keep dying; stopping",
                        extra={"fields": {"exitcode": child.exitcode}},
                    )
                    on_signal(signal.SIGTERM, None)
                    _join_all(children, config)
                    return 1
                restarts.append(now)
                log.warning(
                    "worker died; restarting",
                    extra={"fields": {"worker": i, "exitcode": child.exitcode}},
                )
                children[i] = spawn(i)
        return 0 if _join_all(children, config) else 1
    finally:
        on_signal(signal.SIGTERM, None)
        _join_all(children, config)
        if sim is not None:
            sim.join(5.0)
            if sim.is_alive():
                sim.kill()
        if reserved is not None:
            reserved.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _join_all(children: list[BaseProcess], config: GatewayConfig) -> bool:
    """Wait for every child (drain time plus a margin), kill stragglers; True if all exited 0."""
    # A worker's shutdown waits up to drain_timeout_s three times: in-flight production
    # requests, the mirror's drain and the writer's final flush.
    deadline = time.monotonic() + 3 * config.drain_timeout_s + 5.0
    clean = True
    for child in children:
        child.join(max(deadline - time.monotonic(), 0.1))
        if child.is_alive():
            child.kill()
            child.join()
            clean = False
        elif child.exitcode not in (0, None):
            clean = False
    return clean
