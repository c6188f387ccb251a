"""The process model of `canary serve`: one event loop per process, N processes on one port.

`serve_forever` runs the gateway in this process when `workers == 1`; otherwise the parent
becomes a supervisor: it reserves the port, starts one built-in simulator process when no live
endpoint is configured (so every worker proxies to the same one), spawns N workers that bind the
port with SO_REUSEPORT, restarts a worker that dies (within a budget), and forwards SIGTERM/SIGINT
to its children. uvloop is used when installed, asyncio's default loop otherwise.

Every host also runs one mirror process (`PlaneProcess`, `gateway.mirror.plane`): the supervisor
starts it before the workers and every worker hands its copies to it over a Unix socket; with
`workers == 1` the worker starts it itself. It runs at a lower CPU priority, dies with its parent
(PR_SET_PDEATHSIG) and is restarted (within the same budget as workers) when it dies.

The supervisor must never serve traffic itself and never leave a child running when it exits.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from multiprocessing.process import BaseProcess

import msgspec

from gateway.config import GatewayConfig, split_host_port
from gateway.lifecycle import die_with_parent, run_loop

log = logging.getLogger("canary.supervisor")

# A worker dying more often than this is a crash loop: the supervisor stops everything.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def replica_name(config: GatewayConfig, role: str = "") -> str:
    """Unique per process lifetime, so summing stored counters never double counts; the mirror
    process adds `role` ("mirror") so its row is told apart from the workers' rows."""
    base = config.replica_name or f"{socket.gethostname()}-{os.getpid()}"
    tag = f"-{role}" if role else ""
    return f"{base[:40]}{tag}-{int(time.time() * 1000):x}"


def serve_forever(config: GatewayConfig) -> int:
    """Run `canary serve` with this config until SIGTERM/SIGINT; returns the exit code."""
    if config.workers == 1:
        from gateway.process.runtime import serve_until_stopped

        run_loop(serve_until_stopped(config), config.event_loop)
        return 0
    return _supervise(config)


def _worker_main(
    config: GatewayConfig,
    index: int,
    parent_pid: int,
    simulator_url: str | None,
    plane_socket: str | None,
) -> None:
    die_with_parent(parent_pid)
    from gateway.logs import setup_logging
    from gateway.process.runtime import serve_until_stopped

    setup_logging(config.log_format, config.log_level)
    run_loop(
        serve_until_stopped(config, simulator_url=simulator_url, plane_socket=plane_socket),
        config.event_loop,
    )


def _plane_main(
    config: GatewayConfig,
    socket_path: str,
    parent_pid: int,
    conn: multiprocessing.connection.Connection,
) -> None:
    die_with_parent(parent_pid)
    from gateway.logs import setup_logging
    from gateway.mirror.plane import lower_priority, serve_plane

    # After the imports (start-up is not slowed by a busy host), before any thread exists (the
    # storage driver's), so every thread inherits the lower priority.
    priority = lower_priority(config.mirror_priority, config.mirror_nice)
    setup_logging(config.log_format, config.log_level)
    replica = replica_name(config, role="mirror")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger("canary.mirror.plane").info(
            "mirror process started",
            extra={"fields": {"pid": os.getpid(), "priority": priority, "replica": replica}},
        )
        await serve_plane(config, socket_path, replica, priority, lambda: conn.send("ready"), stop)

    run_loop(main(), config.event_loop)


class PlaneProcess:
    """The host's mirror process: started, waited for, restarted when it dies, stopped last.

    Blocking methods (`start`, `stop`): call them from a thread when on an event loop."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._dir = tempfile.mkdtemp(prefix="canary-mirror-")
        self.socket_path = os.path.join(self._dir, "mirror.sock")
        self._proc: BaseProcess | None = None
        self._ready: multiprocessing.connection.Connection | None = None
        self._restarts: deque[float] = deque()
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def sentinel(self) -> int | None:
        return self._proc.sentinel if self._proc is not None else None

    def spawn(self) -> None:
        """Start the process (a fork and exec, milliseconds). Call it from the thread that
        lives as long as this process (the main thread): PR_SET_PDEATHSIG fires when the
        spawning *thread* exits, so a pool thread would take the mirror process down with it."""
        ctx = multiprocessing.get_context("spawn")
        self._ready, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_plane_main,
            args=(self._config, self.socket_path, os.getpid(), child_end),
            name="canary-mirror",
        )
        proc.start()
        self._proc = proc

    def start(self, timeout_s: float = 30.0) -> None:
        """Spawn it and wait until it listens; raises RuntimeError if it does not."""
        self.spawn()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the spawned process listens (any thread); RuntimeError if it does not."""
        proc, parent_end = self._proc, self._ready
        assert proc is not None and parent_end is not None
        multiprocessing.connection.wait([parent_end, proc.sentinel], timeout_s)
        if not parent_end.poll():
            proc.kill()
            proc.join()
            raise RuntimeError(f"the mirror process did not start (exit code {proc.exitcode})")
        parent_end.recv()

    def restart(self, spawn_only: bool = False) -> bool:
        """Start a dead mirror process again; False once it died MAX_RESTARTS times a minute.
        `spawn_only`: do not wait until it listens (the caller waits with `wait_ready`)."""
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        exitcode = self._proc.exitcode if self._proc is not None else None
        if len(self._restarts) >= MAX_RESTARTS:
            log.error(
                "the mirror process keeps dying; mirroring stopped, production unaffected",
                extra={"fields": {"exitcode": exitcode, "restarts": self.restarts}},
            )
            return False
        self._restarts.append(now)
        self.restarts += 1
        log.warning("mirror process died; restarting", extra={"fields": {"exitcode": exitcode}})
        if spawn_only:
            self.spawn()
        else:
            self.start()
        return True

    def stop(self, timeout_s: float) -> None:
        """SIGTERM it (it drains), wait `timeout_s`, then kill; remove its socket directory."""
        proc = self._proc
        if proc is not None:
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(self._dir, ignore_errors=True)


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
    plane: PlaneProcess | None = None
    plane_ok = True
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        # The mirror process is stopped after the workers, so it receives their last copies.
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
        plane = PlaneProcess(config)
        plane.start()
        log.info("started the mirror process", extra={"fields": {"pid": plane.pid}})
        host, port = split_host_port(config.listen)
        if port == 0:
            reserved = _reserve_port(host)
            port = reserved.getsockname()[1]
            config = msgspec.structs.replace(config, listen=f"[{host}]:{port}")

        def spawn(index: int) -> BaseProcess:
            proc = ctx.Process(
                target=_worker_main,
                args=(config, index, os.getpid(), simulator_url, plane.socket_path),
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
            sentinels = [c.sentinel for c in children]
            if plane_ok and plane.sentinel is not None:
                sentinels.append(plane.sentinel)
            multiprocessing.connection.wait(sentinels, timeout=1.0)
            if stopping:
                break
            if plane_ok and not plane.alive:
                plane_ok = plane.restart()  # workers reconnect on their own
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
        if plane is not None:
            plane.stop(2 * config.drain_timeout_s + 5.0)
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
