"""The process model of `canary serve`: one event loop per process, N processes on one port.

`serve_forever` runs the gateway in this process when `workers == 1`; otherwise the parent
becomes a supervisor: it reserves the port, starts one built-in simulator process when one is
needed (`gateway.process.simulator`, so every worker proxies to the same one), spawns N workers
that bind the port with SO_REUSEPORT, restarts a worker that dies (within a budget), and forwards
SIGTERM/SIGINT to its children. uvloop is used when installed, asyncio's default loop otherwise.

The supervisor also creates the host's session-arm table (the ramp's session -> arm memory, a
named shared-memory file under `rollout.arms_dir`) before the workers and removes it after
them; each worker maps it by path (with `workers == 1` the worker creates it itself).

Every host also runs one mirror process (`PlaneProcess`, `gateway.process.children`): the supervisor
starts it before the workers and every worker hands its copies to it over a Unix socket; with
`workers == 1` the worker starts it itself. It runs at a lower CPU priority, dies with its parent
(PR_SET_PDEATHSIG) and is restarted (within the same budget as workers) when it dies.

The supervisor must never serve traffic itself and never leave a child running when it exits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
from collections import deque
from multiprocessing.process import BaseProcess
from typing import Any

import msgspec

from domain.errors import ProcessDidNotStart
from gateway.config.sections import GatewayConfig, split_host_port
from gateway.lifecycle import die_with_parent, run_loop, stop_resource_tracker
from gateway.logs import setup_logging
from gateway.process import simulator
from gateway.process.children import (
    MAX_RESTARTS,
    RESTART_WINDOW_S,
    PlaneProcess,
    ReportProcess,
    StartWatch,
)
from gateway.process.runtime import create_arms, prepare_storage, serve_until_stopped

log = logging.getLogger("canary.supervisor")


def serve_forever(config: GatewayConfig) -> int:
    """Run `canary serve` with this config until SIGTERM/SIGINT; returns the exit code."""
    try:
        if config.server.workers == 1:
            run_loop(serve_until_stopped(config), config.server.event_loop)
            return 0
        return _supervise(config)
    finally:
        # Every child is gone; the spawn start method's resource tracker goes last (as PID 1
        # of a container, what outlives this process is killed by the kernel).
        if not stop_resource_tracker():
            log.warning("multiprocessing's resource tracker did not exit in time")


def _worker_main(
    config: GatewayConfig,
    index: int,
    parent_pid: int,
    simulator_url: str | None,
    plane_socket: str | None,
    report_socket: str | None,
    arms_path: str | None = None,
) -> None:
    die_with_parent(parent_pid)
    setup_logging(config.server.log_format, config.server.log_level)
    run_loop(
        serve_until_stopped(
            config,
            simulator_url=simulator_url,
            plane_socket=plane_socket,
            report_socket=report_socket,
            arms_path=arms_path,
            worker=index,
        ),
        config.server.event_loop,
    )


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
    reserved: socket.socket | None = None
    plane: PlaneProcess | None = None
    reporter: ReportProcess | None = None
    plane_ok = reporter_ok = True
    started: StartWatch | None = None  # the report process, spawned and not yet listening
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        # The mirror process is stopped after the workers, so it receives their last copies.
        nonlocal stopping
        stopping = True
        for proc in children:
            if proc.is_alive():
                proc.terminate()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    stack = contextlib.ExitStack()  # the simulator, stopped after the workers and the plane
    try:
        try:
            simulator_url = stack.enter_context(simulator.simulator_process(config))
        except ProcessDidNotStart as exc:  # it did not start: nothing was served
            log.error(str(exc))
            return 1
        run_loop(prepare_storage(config))
        # Closed by the stack after the workers joined: no worker maps a removed file.
        arms = stack.enter_context(create_arms(config))
        plane = PlaneProcess(config)
        plane.start()
        log.info("started the mirror process", extra={"fields": {"pid": plane.pid}})
        if config.reports.enabled:
            reporter = ReportProcess(config)
            # Waited for `report_start_wait_s` at most (`blocks_start`): then the loop below
            # says when it listens.
            reporter.spawn()
            log.info("spawned the report process", extra={"fields": {"pid": reporter.pid}})
            started = StartWatch(reporter)
            if started.check(config.reports.start_wait_s):
                started = None
        host, port = split_host_port(config.server.listen)
        if port == 0:
            reserved = _reserve_port(host)
            port = reserved.getsockname()[1]
            server = msgspec.structs.replace(config.server, listen=f"[{host}]:{port}")
            config = msgspec.structs.replace(config, server=server)

        def spawn(index: int) -> BaseProcess:
            proc = ctx.Process(
                target=_worker_main,
                args=(
                    config,
                    index,
                    os.getpid(),
                    simulator_url,
                    plane.socket_path,
                    None if reporter is None else reporter.socket_path,
                    arms.path,
                ),
                name=f"canary-worker-{index}",
            )
            proc.start()
            return proc

        children.extend(spawn(i) for i in range(config.server.workers))
        log.info(
            "supervising workers",
            extra={"fields": {"workers": config.server.workers, "pids": [c.pid for c in children]}},
        )
        restarts: deque[float] = deque()
        while not stopping:
            sentinels: list[Any] = [c.sentinel for c in children]  # pids' fds and pipes
            if plane_ok and plane.sentinel is not None:
                sentinels.append(plane.sentinel)
            if reporter is not None and reporter_ok and reporter.sentinel is not None:
                sentinels.append(reporter.sentinel)
                if started is not None and reporter.ready_signal is not None:
                    sentinels.append(reporter.ready_signal)  # log "ready" when it is
            multiprocessing.connection.wait(sentinels, timeout=1.0)
            if stopping:
                break
            if plane_ok and not plane.alive:
                plane_ok = plane.restart()  # workers reconnect on their own
            if reporter is not None and reporter_ok and not reporter.alive:
                # Not waited for (`blocks_start`): workers' next report connects anew.
                reporter_ok = reporter.restart(spawn_only=True)
                started = StartWatch(reporter) if reporter_ok else None
            if reporter is not None and started is not None and reporter.alive:
                started = None if started.check(0.0) else started
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
        if reporter is not None and started is not None and reporter.alive:
            started.check(0.0)  # ready since the last look: say so before stopping
        return 0 if _join_all(children, config) else 1
    finally:
        on_signal(signal.SIGTERM, None)
        _join_all(children, config)
        if plane is not None:
            plane.stop(2 * config.server.drain_timeout_s + 5.0)
        if reporter is not None:
            reporter.stop(5.0)
        stack.close()
        if reserved is not None:
            reserved.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _join_all(children: list[BaseProcess], config: GatewayConfig) -> bool:
    """Wait for every child (drain time plus a margin), kill stragglers; True if all exited 0,
    or were stopped by the supervisor's SIGTERM before they could serve."""
    # A worker's shutdown waits up to drain_timeout_s three times: in-flight production
    # requests, the mirror's drain and the writer's final flush.
    deadline = time.monotonic() + 3 * config.server.drain_timeout_s + 5.0
    clean = True
    for child in children:
        child.join(max(deadline - time.monotonic(), 0.1))
        if child.is_alive():
            child.kill()
            child.join()
            clean = False
        elif child.exitcode == -signal.SIGTERM:
            # A worker handles SIGTERM (drains, exits 0) from the first line of its event loop,
            # before it listens; dying of it means it was still starting (a rollout that stops
            # a pod right after it became ready): it never held a request.
            log.info("worker stopped while starting", extra={"fields": {"pid": child.pid}})
        elif child.exitcode not in (0, None):
            clean = False
    return clean
