"""The host's mirror and report processes as children of `canary serve`: spawned, waited for,
restarted, stopped.

`PlaneProcess` is used by the supervisor (`gateway.process.workers`, `--workers N`) and by a
single worker that starts its own (`gateway.process.runtime`); both import it from here, so the
two wiring modules never import each other back. The process itself runs
`gateway.mirror.plane.serve_plane` at a lower CPU priority and dies with its parent
(PR_SET_PDEATHSIG). `ReportProcess` is the same life cycle for the host's report process
(`gateway.control.reports.serve_reports`): control-plane work off production's processes.
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
from collections.abc import Awaitable, Callable
from multiprocessing.process import BaseProcess

from domain.errors import ProcessDidNotStart
from gateway.config.sections import GatewayConfig
from gateway.lifecycle import die_with_parent, lower_priority, run_loop, settle_heap

log = logging.getLogger("canary.supervisor")

# A worker dying more often than this is a crash loop: the supervisor stops everything.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def replica_name(config: GatewayConfig, role: str = "") -> str:
    """Unique per process lifetime, so summing stored counters never double counts; the mirror
    process adds `role` ("mirror") so its row is told apart from the workers' rows."""
    base = config.server.replica_name or f"{socket.gethostname()}-{os.getpid()}"
    tag = f"-{role}" if role else ""
    return f"{base[:40]}{tag}-{int(time.time() * 1000):x}"


def _run_until_signal(
    config: GatewayConfig,
    logger: str,
    message: str,
    fields: dict[str, object],
    serve: Callable[[asyncio.Event], Awaitable[None]],
) -> None:
    """Run a child process's `serve(stop)` on the configured event loop until SIGTERM/SIGINT
    sets `stop`, after logging that it started."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger(logger).info(message, extra={"fields": fields})
        await serve(stop)

    run_loop(main(), config.server.event_loop)


def _plane_main(
    config: GatewayConfig,
    socket_path: str,
    parent_pid: int,
    conn: multiprocessing.connection.Connection,
) -> None:
    die_with_parent(parent_pid)
    from gateway.logs import setup_logging
    from gateway.mirror.plane import serve_plane

    # After the imports (start-up is not slowed by a busy host), before any thread exists (the
    # storage driver's), so every thread inherits the lower priority.
    priority = lower_priority(config.mirror.priority, config.mirror.nice)
    setup_logging(config.server.log_format, config.server.log_level)
    replica = replica_name(config, role="mirror")

    def ready() -> None:
        conn.send("ready")
        settle_heap()  # this process's own heap: what it built to serve is kept for its life

    _run_until_signal(
        config,
        "canary.mirror.plane",
        "mirror process started",
        {"pid": os.getpid(), "priority": priority, "replica": replica},
        lambda stop: serve_plane(config, socket_path, replica, priority, ready, stop),
    )


def _report_main(
    config: GatewayConfig,
    socket_path: str,
    parent_pid: int,
    conn: multiprocessing.connection.Connection,
) -> None:
    """The host's report process: every report, gate and promotion's report is built here."""
    die_with_parent(parent_pid)
    # Before the imports (the statistics stack: ~0.9 s of CPU), unlike the mirror process: a
    # report process restarted beside production starts at its own priority, and a saturated
    # host delays its start as it delays reports, never production.
    priority = lower_priority(config.reports.priority, config.reports.nice)
    from gateway.control.reports import serve_reports
    from gateway.logs import setup_logging

    setup_logging(config.server.log_format, config.server.log_level)

    _run_until_signal(
        config,
        "canary.reports",
        "report process started",
        {"pid": os.getpid(), "priority": priority},
        lambda stop: serve_reports(
            config.reports,
            config.storage,
            config.verdict,
            socket_path,
            lambda: conn.send("ready"),
            stop,
            controller_interval_s=config.rollout.controller_interval_s,
        ),
    )


class PlaneProcess:
    """The host's mirror process: started, waited for, restarted when it dies, stopped last.
    (`ReportProcess` is the same life cycle for the host's report process.)

    Blocking methods (`start`, `stop`): call them from a thread when on an event loop."""

    role = "mirror"
    _target = staticmethod(_plane_main)
    # The mirror process starts at production's priority (it lowers it once it listens), so its
    # start is waited for: copies go to it from the first request on.
    blocks_start = True

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._dir = tempfile.mkdtemp(prefix=f"canary-{self.role}-")
        self.socket_path = os.path.join(self._dir, f"{self.role}.sock")
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
            target=self._target,
            args=(self._config, self.socket_path, os.getpid(), child_end),
            name=f"canary-{self.role}",
        )
        proc.start()
        self._proc = proc

    def start(self, timeout_s: float = 30.0) -> None:
        """Spawn it and wait until it listens; raises ProcessDidNotStart if it does not."""
        self.spawn()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the spawned process listens (any thread); ProcessDidNotStart if not."""
        if not self.poll_ready(timeout_s):
            proc = self._proc
            assert proc is not None
            proc.kill()
            proc.join()
            raise ProcessDidNotStart(
                f"the {self.role} process did not start (exit code {proc.exitcode})"
            )

    @property
    def ready_signal(self) -> multiprocessing.connection.Connection | None:
        """What becomes readable when the spawned process says it listens (for
        `multiprocessing.connection.wait`), or None before a spawn."""
        return self._ready

    def poll_ready(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` (any thread) for the spawned process to say it listens: True
        once it has (said once per spawn), False while it has not or when it died (`alive`)."""
        proc, parent_end = self._proc, self._ready
        assert proc is not None and parent_end is not None
        multiprocessing.connection.wait([parent_end, proc.sentinel], timeout_s)
        if not parent_end.poll():
            return False
        try:
            parent_end.recv()
        except EOFError:  # it died before saying so: its end of the pipe closed
            return False
        return True

    def restart(self, spawn_only: bool = False) -> bool:
        """Start a dead mirror process again; False once it died MAX_RESTARTS times a minute.
        `spawn_only`: do not wait until it listens (the caller waits with `wait_ready`)."""
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        exitcode = self._proc.exitcode if self._proc is not None else None
        if len(self._restarts) >= MAX_RESTARTS:
            log.error(
                f"the {self.role} process keeps dying; left down, production unaffected",
                extra={"fields": {"exitcode": exitcode, "restarts": self.restarts}},
            )
            return False
        self._restarts.append(now)
        self.restarts += 1
        log.warning(
            f"{self.role} process died; restarting", extra={"fields": {"exitcode": exitcode}}
        )
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


class ReportProcess(PlaneProcess):
    """The host's report process (`gateway.control.reports`): reports, the rollout gate and the
    report a promotion takes run here at `report_priority`, never in a worker. Same life cycle
    as the mirror process: spawned by the wiring, dies with its parent, restarted when it dies
    (5 times a minute at most, then left down: reports answer 503, production goes on)."""

    role = "report"
    _target = staticmethod(_report_main)
    # Spawned and waited for `report_start_wait_s` at most, never killed for being slow: at
    # idle priority on a saturated host its start (imports, ~1 s of CPU) waits for spare CPU,
    # and neither production nor a restart may wait for that. Until it listens, reports
    # answer 503.
    blocks_start = False


# A process not waited for at start (`blocks_start` False) that has not listened after this
# long is logged, once.
SLOW_START_S = 30.0


class StartWatch:
    """A process spawned without waiting for it: logs when it listens, warns once when slow."""

    def __init__(self, proc: PlaneProcess) -> None:
        self.proc = proc
        self.since = time.monotonic()
        self.warned = False

    def check(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` (any thread); True once it listens."""
        ready = self.proc.poll_ready(timeout_s)
        took = round(time.monotonic() - self.since, 1)
        if ready:
            fields = {"pid": self.proc.pid, "after_s": took}
            log.info(f"the {self.proc.role} process is ready", extra={"fields": fields})
            return True
        if not self.warned and took > SLOW_START_S:
            self.warned = True
            log.warning(
                f"the {self.proc.role} process has not started after {SLOW_START_S:g} s: it "
                "starts at its own (low) priority and the host is busy; it answers 503 until "
                "it does, production is unaffected",
                extra={"fields": {"pid": self.proc.pid}},
            )
        return False
