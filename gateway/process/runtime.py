"""Assembles one worker: storage, registry, the mirror hand-off, admin API, metrics.

`app.py` builds the proxy application; this module composes everything else around it, in the
order start-up and shutdown need:

    start:    schema check -> registry (seeds, loads, sets the live target) -> the host's mirror
              process (started here unless a supervisor passed its socket) -> hand-off connects
              -> counters flusher -> the host's session-arm table (created here unless a
              supervisor passed its path) and this process's ramp router -> HTTP listener
    shutdown: stop the listener (in-flight production requests finish) -> the arm table
              unmapped (removed when this process created it) -> flusher stops
              -> hand-off drains its channel (up to drain_timeout_s) -> last counters flush
              -> mirror process stopped (it drains lanes, flushes its writer) -> registry
              -> engine disposed

The ramp's router is `Components.router` (also `app[RAMP].router`): the rollout controller swaps
its snapshot; a worker's guard trip is made durable by `app[RAMP].hook` (None: this worker only).

The worker holds no ring, lane or observation writer: those live in the mirror process
(`gateway.mirror.plane`), which production never awaits.

Storage trouble after start-up never stops the proxy (the writer queues, retries, drops and
counts); storage trouble *at* start-up (schema behind, database unreachable) is reported with
what to do, exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import msgspec
from aiohttp import web
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors as storage_errors
from domain.endpoint import Endpoint
from domain.errors import ProcessDidNotStart, SchemaBehind, UsageError
from domain.exposition import Family, Sample
from evaluators.judge.settings import VerdictSettings
from gateway.config.load import parse_admin_tokens
from gateway.config.sections import GatewayConfig
from gateway.control.admin.handlers import AdminContext, build_admin_app
from gateway.control.admin.labels import LabelSettings
from gateway.control.registry import Registry, Snapshot
from gateway.control.reports import RemoteReports
from gateway.lifecycle import settle_heap
from gateway.mirror.channel.frames import MetricsMeta
from gateway.mirror.channel.handoff import Handoff
from gateway.process import simulator
from gateway.process.children import PlaneProcess, ReportProcess, StartWatch, replica_name
from gateway.rollout.arms import ArmRouter, SessionArms
from gateway.rollout.state import GuardTrips
from gateway.server.app import (
    READY_CHECKS,
    ROLLOUT_ROUTE,
    AppCustomizer,
    RunningGateway,
    mount_admin,
    start_gateway,
)
from gateway.server.hooks import LiveTarget
from gateway.server.prometheus import Exporter
from storage import queries
from storage.engine import ensure_schema, make_engine, masked

log = logging.getLogger("canary.gateway")

SIMULATOR_KIND = "simulator"  # kind of a live endpoint that is the built-in simulator


@dataclass
class Components:
    """The running parts of one gateway process (tests and the demo reach in through this)."""

    config: GatewayConfig
    replica: str
    engine: AsyncEngine
    live: LiveTarget
    registry: Registry
    mirror: Handoff
    metrics: Exporter
    gateway: RunningGateway | None = None
    plane: PlaneProcess | None = None  # the mirror process, when this worker started it
    reports: RemoteReports | None = None  # the client of the host's report process
    report_process: ReportProcess | None = None  # the report process, when this worker started it
    router: ArmRouter | None = None  # the ramp's router: the rollout controller swaps it

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url


class _CountersFlusher:
    """Saves the mirror's copy accounting to storage every `interval_s`, and once at the end."""

    def __init__(self, parts: Components, interval_s: float) -> None:
        self._parts = parts
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.errors = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="counters-flush")

    async def flush(self) -> None:
        try:
            await queries.upsert_counters(
                self._parts.engine, self._parts.replica, self._parts.mirror.counters()
            )
        except storage_errors.StorageError:
            self.errors += 1  # the next flush carries the totals; nothing is lost

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


REGISTRY_VERSION: Final = Family(
    "canary_registry_version", "gauge", "Control-plane version this replica applies."
)
REGISTRY_RELOADS: Final = Family(
    "canary_registry_reloads_total", "counter", "Snapshots loaded from storage."
)
REGISTRY_POLL_ERRORS: Final = Family(
    "canary_registry_poll_errors_total",
    "counter",
    "Registry polls that failed (old snapshot kept).",
)
ROLLOUT_STORE_HOLDS: Final = Family(
    "canary_rollout_store_holds_total",
    "counter",
    "Times the ramp was held (new sessions to production) because the store had not answered "
    "for rollout.store_loss_hold_s.",
)
ROLLOUT_STORE_HELD: Final = Family(
    "canary_rollout_store_held",
    "gauge",
    "1 while the ramp is held for want of its store, else 0.",
)
ROLLOUT_GUARD_PENDING: Final = Family(
    "canary_rollout_guard_rollbacks_pending",
    "gauge",
    "Guard rollbacks decided by this worker and not yet stored (retried until they are).",
)
MIRROR_RESTARTS: Final = Family(
    "canary_mirror_process_restarts_total",
    "counter",
    "Times this process restarted the mirror.",
)
REPORT_RESTARTS: Final = Family(
    "canary_report_process_restarts_total",
    "counter",
    "Times this process restarted the report process.",
)


def _registry_lines(registry: Registry) -> list[Sample]:
    stats = registry.stats()
    return [
        REGISTRY_VERSION.sample(stats["version"]),
        REGISTRY_RELOADS.sample(stats["reloads"]),
        REGISTRY_POLL_ERRORS.sample(stats["poll_errors"]),
        ROLLOUT_STORE_HOLDS.sample(stats["store_holds"]),
        ROLLOUT_STORE_HELD.sample(stats["store_held"]),
    ]


def arms_directory(config: GatewayConfig) -> str:
    """Where the host's session-arm table lives: `rollout.arms_dir`, else /dev/shm (memory, not
    disk), else the temp dir."""
    if config.rollout.arms_dir:
        return config.rollout.arms_dir
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def create_arms(config: GatewayConfig) -> SessionArms:
    """Create the host's session-arm table (by the supervisor, or the single process); its
    `close` removes the file. The name is unique (pid and a random part): a file left by a
    killed gateway never blocks a new one."""
    name = f"canary-arms-{os.getpid()}-{secrets.token_hex(4)}"
    return SessionArms.create(
        os.path.join(arms_directory(config), name),
        slots=config.rollout.arms_slots,
        ttl_s=config.rollout.arms_ttl_s,
    )


async def _check_schema(engine: AsyncEngine, db_url: str) -> None:
    try:
        await ensure_schema(engine, db_url)
    except storage_errors.SchemaBehind as exc:
        raise SchemaBehind(str(exc)) from exc
    except storage_errors.StorageError as exc:
        raise UsageError(f"storage {masked(db_url)}: {exc}") from exc


async def _seed_live(config: GatewayConfig, engine: AsyncEngine, url: str) -> Endpoint:
    """The live endpoint to seed, at `url` (`gateway.process.simulator.live_url`).

    A stored live endpoint of kind "simulator" is a placeholder from an earlier zero-setup run:
    it is pointed at this run's live endpoint (the simulator's new port, or the `--live` URL now
    given). A real stored live endpoint (from `--live` or a promotion) is left alone.
    """
    seed = config.live.endpoint(url)
    if simulator.needed(config):
        seed = msgspec.structs.replace(seed, kind=SIMULATOR_KIND)
    _version, endpoints = await queries.load_endpoints(engine)
    stored = next((e for e in endpoints if e.role == "live"), None)
    if stored is not None and stored.kind == SIMULATOR_KIND and stored.url != seed.url:
        await queries.update_endpoint(engine, stored.name, {"url": seed.url, "kind": seed.kind})
        log.info(
            "pointed the stored simulator live endpoint at this run's live endpoint",
            extra={"fields": {"name": stored.name, "url": seed.url}},
        )
    return seed


async def prepare_storage(config: GatewayConfig) -> None:
    """Check (and on a new SQLite file, create) the schema once, before `--workers N` processes
    start, so they never race to migrate and a schema error stops the supervisor with exit 2."""
    engine = make_engine(config.storage.db_url)
    try:
        await _check_schema(engine, config.storage.db_url)
    finally:
        await engine.dispose()


def _customize(parts: Components) -> list[AppCustomizer]:
    config = parts.config

    def add_admin(app: web.Application) -> None:
        assert parts.reports is not None
        ctx = AdminContext(
            engine=parts.engine,
            registry=parts.registry,
            tokens=parse_admin_tokens(config.admin.token),
            insecure=config.admin.insecure,
            counters=parts.mirror.host_counters,
            writer_stats=parts.mirror.writer_stats,
            verdict_settings=_verdict_settings(config),
            listen_host=config.server.host,
            rates=parts.mirror.host_rates,
            replica=parts.replica,
            reports=parts.reports,
            default_min_step_s=config.rollout.default_min_step_s,
            labellers=parse_admin_tokens(config.admin.labeller_token),
            labels=LabelSettings(
                store_text=config.storage.store_text,
                double_rate=config.admin.label_double_rate,
                retention_s=config.admin.label_retention_s,
            ),
        )
        mount_admin(app, build_admin_app(ctx, config.admin, config.credentials, config.limits))

        async def storage_ready() -> tuple[bool, str]:
            # Reported, never gating: a database outage must not take every replica out of a
            # load balancer, because the proxy serves on (observations queue, then drop).
            depth = parts.mirror.writer_stats().get("queue_depth", 0)
            try:
                async with asyncio.timeout(2.0), parts.engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            except Exception as exc:  # any failure: report its name, stay ready
                return True, (
                    f"{masked(config.storage.db_url)} unreachable ({type(exc).__name__}); "
                    f"proxy unaffected, writer queue {depth}"
                )
            return True, f"{masked(config.storage.db_url)} reachable, writer queue {depth}"

        app[READY_CHECKS]["storage"] = storage_ready

    return [add_admin]


def _verdict_settings(config: GatewayConfig) -> VerdictSettings:
    return VerdictSettings().with_overrides(config.verdict)


@contextlib.asynccontextmanager
async def running(
    config: GatewayConfig,
    *,
    simulator_url: str | None = None,
    plane_socket: str | None = None,
    report_socket: str | None = None,
    arms_path: str | None = None,
    worker: int | None = None,
) -> AsyncIterator[Components]:
    """Start a complete gateway on `config.server.listen`; stop it, in order, on exit.

    `simulator_url`: the built-in simulator a `--workers` supervisor started for all workers
    (`gateway.process.simulator` decides when there is one; without it, it starts one here).
    `plane_socket`: the host's mirror process the supervisor started; without it this process
    starts (and owns) one. `report_socket`: likewise, the host's report process. `arms_path`:
    the host's session-arm table the supervisor created; without it this process creates one.
    `worker`: this process's index among the host's workers (None: the only one); its series
    then carry `worker="<index>"` and its /metrics serves the whole host's."""
    engine = make_engine(config.storage.db_url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(engine.dispose)
        await _check_schema(engine, config.storage.db_url)
        url = await stack.enter_async_context(simulator.live_url(config, simulator_url))
        try:
            seed = await _seed_live(config, engine, url)
        except storage_errors.StorageError as exc:
            raise UsageError(f"storage {masked(config.storage.db_url)}: {exc}") from exc
        replica = replica_name(config)
        metrics = Exporter()
        live = LiveTarget(seed)
        plane: PlaneProcess | None = None
        if plane_socket is None:
            plane = PlaneProcess(config)
            try:
                plane.spawn()  # on this (the main) thread: see PlaneProcess.spawn
                await asyncio.to_thread(plane.wait_ready)
            except ProcessDidNotStart as exc:
                await asyncio.to_thread(plane.stop, 1.0)
                raise UsageError(str(exc)) from exc
            stack.push_async_callback(
                asyncio.to_thread, plane.stop, 2 * config.server.drain_timeout_s
            )
            plane_socket = plane.socket_path
        report_process: ReportProcess | None = None
        report_start: StartWatch | None = None
        if report_socket is None and config.reports.enabled:
            report_process = ReportProcess(config)
            # The main thread, as the mirror process; waited for `report_start_wait_s` at most
            # (`blocks_start`): then the watcher below says when it listens, and reports
            # answer 503 until then.
            report_process.spawn()
            stack.push_async_callback(asyncio.to_thread, report_process.stop, 5.0)
            report_start = StartWatch(report_process)
            if await asyncio.to_thread(report_start.check, config.reports.start_wait_s):
                report_start = None
            report_socket = report_process.socket_path
        reports = RemoteReports(report_socket, config.reports.timeout_s)
        stack.push_async_callback(reports.close)
        handoff = Handoff(
            config.mirror, live, plane_socket, replica, session_header=config.server.session_header
        )

        def on_change(snapshot: Snapshot) -> None:
            handoff.apply(snapshot.candidates)

        # The ramp's router exists before the registry starts: the registry applies the stored
        # rollout to it before this worker serves (a restart never serves a stale weight).
        table = create_arms(config) if arms_path is None else SessionArms.open(arms_path)
        stack.callback(table.close)  # after the listener stopped: no request routes any more
        router = ArmRouter(table)
        registry = Registry(
            engine,
            live,
            poll_interval_s=config.storage.registry_poll_interval_s,
            on_change=on_change,
            router=router,
            store_loss_hold_s=config.rollout.store_loss_hold_s,
            store_resume_after_s=config.rollout.store_resume_after_s,
        )
        parts = Components(
            config,
            replica,
            engine,
            live,
            registry,
            handoff,
            metrics,
            plane=plane,
            reports=reports,
            report_process=report_process,
        )
        try:
            await registry.start(
                seed_live=seed, seed_candidates=[c.to_endpoint() for c in config.candidates]
            )
        except storage_errors.StorageError as exc:
            raise UsageError(f"storage {masked(config.storage.db_url)}: {exc}") from exc
        stack.push_async_callback(registry.close)
        await handoff.start()  # after seeding: the mirror process waits for a live endpoint
        stack.push_async_callback(handoff.close, config.server.drain_timeout_s)
        flusher = _CountersFlusher(parts, config.storage.counters_flush_interval_s)
        stack.push_async_callback(flusher.flush)  # after the channel drained: final totals
        flusher.start()
        stack.push_async_callback(flusher.close)
        for child, starting in ((plane, None), (report_process, report_start)):
            if child is not None:
                watch = asyncio.get_running_loop().create_task(
                    _watch_plane(child, starting), name=f"{child.role}-watch"
                )
                stack.push_async_callback(_cancel, watch)
        metrics.add_collector(handoff.prometheus_lines)
        if worker is not None:
            label = str(worker)
            metrics.join_host(label, handoff.peer_metrics)
            handoff.own_metrics = lambda: MetricsMeta(label, metrics.render_local())
        metrics.add_collector(lambda: _plane_lines(parts))
        metrics.add_collector(lambda: _registry_lines(registry))
        metrics.add_collector(reports.samples)
        parts.router = router
        # A worker's guard trip becomes a stored, pushed rollback; the registry applies it here.
        guard = GuardTrips(
            engine,
            on_done=registry.refresh,
            retry_max_s=config.rollout.store_retry_max_s,
            drain_s=config.server.drain_timeout_s,
        )
        stack.push_async_callback(guard.close)
        metrics.add_collector(lambda: [ROLLOUT_GUARD_PENDING.sample(guard.pending)])
        parts.gateway = await start_gateway(
            config,
            live=live,
            tee=handoff,
            metrics=metrics,
            customize=_customize(parts),
            router=router,
            rollout_sink=handoff,
            rollout_guard=guard,
        )
        assert parts.gateway.app[ROLLOUT_ROUTE].router is parts.router
        stack.push_async_callback(parts.gateway.close)
        yield parts


async def _watch_plane(plane: PlaneProcess, starting: StartWatch | None = None) -> None:
    """Restart this worker's own mirror (or report) process when it dies (the supervisor does
    it for N workers). `starting`: it was spawned and has not listened yet."""
    if starting is not None:
        await until_ready(plane, starting)
    while True:
        await asyncio.sleep(1.0)
        if plane.alive:
            continue
        if not plane.restart(spawn_only=True):  # spawned on the loop thread: milliseconds
            return
        if not plane.blocks_start:
            await until_ready(plane)
            continue
        with contextlib.suppress(RuntimeError):  # it died again: the next tick retries
            await asyncio.to_thread(plane.wait_ready)


async def until_ready(plane: PlaneProcess, watch: StartWatch | None = None) -> None:
    """Wait, never kill, until a process spawned without waiting listens (logged) or dies."""
    watch = watch or StartWatch(plane)
    while plane.alive:
        if await asyncio.to_thread(watch.check, 1.0):
            return


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _plane_lines(parts: Components) -> list[Sample]:
    restarts = parts.plane.restarts if parts.plane is not None else 0
    reporter = parts.report_process.restarts if parts.report_process is not None else 0
    return [MIRROR_RESTARTS.sample(restarts), REPORT_RESTARTS.sample(reporter)]


async def serve_until_stopped(
    config: GatewayConfig,
    *,
    simulator_url: str | None = None,
    plane_socket: str | None = None,
    report_socket: str | None = None,
    arms_path: str | None = None,
    stop: asyncio.Event | None = None,
    worker: int | None = None,
) -> None:
    """What each `canary serve` process runs: the complete gateway until SIGTERM/SIGINT. The
    process is its own, so its heap is settled once it serves (`lifecycle.settle_heap`)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with running(
            config,
            simulator_url=simulator_url,
            plane_socket=plane_socket,
            report_socket=report_socket,
            arms_path=arms_path,
            worker=worker,
        ) as parts:
            log.info(
                "canary-gateway listening",
                extra={
                    "fields": {
                        "url": parts.url,
                        "live_url": parts.live.endpoint.url,
                        "db": masked(config.storage.db_url),
                        "candidates": [c.name for c in parts.registry.snapshot.candidates],
                        "replica": parts.replica,
                        "pid": os.getpid(),
                        "loop": type(loop).__module__,
                    }
                },
            )
            settle_heap()
            await stop.wait()
            log.info("shutting down", extra={"fields": {"pid": os.getpid()}})
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
