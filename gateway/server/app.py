"""Builds and runs the gateway's aiohttp application: proxy, health, readiness, metrics, lifecycle.

`build_app` wires the catch-all proxy route and the gateway's own `/healthz`, `/readyz` and
`/metrics` (never forwarded), with the upstream session owned by a `cleanup_ctx`. Other parts
compose onto the returned app before it starts: append to `app.cleanup_ctx`,
`app.add_subapp("/admin", ...)` (a more specific prefix wins over the catch-all
whatever the order), and append async readiness checks to `app[READY_CHECKS]`.
`start_gateway` runs one on a socket, proxying to the live endpoint it is given (it never starts
one: the process wiring, `gateway.process`, decides when the built-in simulator runs); the
wiring composes the complete gateway (storage, registry, mirror, admin) around it.

This module must never do per-request work itself: requests go straight to `Proxy.handle`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from domain.errors import ConfigError
from gateway.config.sections import GatewayConfig, split_host_port
from gateway.rollout.arms import ArmRouter
from gateway.rollout.hooks import RolloutGuard, RolloutSink
from gateway.rollout.route import RolloutRoute
from gateway.server.connections import ConnectionStats, GatewayRunner
from gateway.server.hooks import LiveTarget, RequestTee
from gateway.server.limits import EdgeLimits, descriptors_wanted, fit_file_limit, plan_limits
from gateway.server.prometheus import Collector, Exporter
from gateway.server.proxy import Proxy, ProxyMetrics
from gateway.server.upstream import UpstreamPool

log = logging.getLogger("canary.gateway")

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
"""A readiness probe: returns (ok, detail). Named by the key it is stored under."""

CONFIG = web.AppKey("canary_config", GatewayConfig)
LIVE = web.AppKey("canary_live", LiveTarget)
METRICS = web.AppKey("canary_metrics", Exporter)
PROXY = web.AppKey("canary_proxy", Proxy)
# The worker's ramp (its `router` is what the rollout controller swaps), when it has a router.
ROLLOUT_ROUTE = web.AppKey("canary_rollout", RolloutRoute)
UPSTREAM_SESSION = web.AppKey("canary_upstream_session", aiohttp.ClientSession)
READY_CHECKS = web.AppKey("canary_ready_checks", dict[str, ReadyCheck])

# Set on an admin app before `mount_admin`: its readiness checks and /metrics collectors.
ADMIN_READY_CHECKS = web.AppKey("canary_admin_ready_checks", dict[str, ReadyCheck])
ADMIN_COLLECTORS = web.AppKey("canary_admin_collectors", list[Collector])
ADMIN_APP = web.AppKey("canary_admin_app", web.Application)  # served on `admin_listen`
CONNECTIONS = web.AppKey("canary_connection_stats", ConnectionStats)

AppCustomizer = Callable[[web.Application], None]
"""Called on the built app before it starts: add cleanup_ctx entries, sub-apps, checks."""

# Headers aiohttp would add on its own; a proxy must forward only what the client sent.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def make_client_session(
    *,
    limit: int,
    keepalive_s: float,
    connect_timeout_s: float,
    limit_per_host: int = 0,
    read_bufsize: int = 2**16,
) -> aiohttp.ClientSession:
    """A pooled keep-alive session that forwards bytes untouched. Call inside a running loop.

    `limit` bounds open connections (0 = unlimited) so a flood cannot exhaust file descriptors;
    requests beyond it wait for a free connection (that wait counts toward time-to-first-byte).
    """
    connector = aiohttp.TCPConnector(
        limit=limit,
        limit_per_host=limit_per_host,
        keepalive_timeout=keepalive_s,
        ttl_dns_cache=60,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=SKIP_AUTO_HEADERS,
        read_bufsize=read_bufsize,
    )


_READY_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
_READY_CONNECTIONS = 4
_TEXT_METRICS = "text/plain; version=0.0.4; charset=utf-8"


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "pid": os.getpid()})


async def _readyz(request: web.Request) -> web.Response:
    checks = request.app[READY_CHECKS]
    results = await asyncio.gather(*(check() for check in checks.values()))
    detail = {
        name: {"ok": ok, "detail": text} for name, (ok, text) in zip(checks, results, strict=True)
    }
    ready = all(ok for ok, _ in results)
    return web.json_response(
        {"status": "ready" if ready else "not ready", "checks": detail},
        status=200 if ready else 503,
    )


async def _metrics(request: web.Request) -> web.Response:
    text = request.app[METRICS].render()
    return web.Response(text=text, headers={"Content-Type": _TEXT_METRICS})


def _live_check(app: web.Application) -> ReadyCheck:
    """The live endpoint answers HTTP (any status below 500) on vLLM's `/health`."""

    async def check() -> tuple[bool, str]:
        session = app.get(UPSTREAM_SESSION)
        if session is None:
            return False, "not started"
        url = app[LIVE].base_url / "health"
        try:
            async with session.get(url, timeout=_READY_TIMEOUT) as resp:
                await resp.read()
                return resp.status < 500, f"{url} -> {resp.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return False, f"{url} unreachable: {type(exc).__name__}"

    return check


def build_app(
    config: GatewayConfig,
    *,
    live: LiveTarget,
    tee: RequestTee | None = None,
    metrics: Exporter | None = None,
    router: ArmRouter | None = None,
    rollout_sink: RolloutSink | None = None,
    rollout_guard: RolloutGuard | None = None,
) -> web.Application:
    """The gateway application; compose more onto it before it starts (see module docstring).
    `router`: this process's ramp router (None: no ramp, every request to production)."""
    app = web.Application(client_max_size=config.limits.max_body_bytes)
    registry = metrics if metrics is not None else Exporter()
    rollout = None
    if router is not None:
        rollout = app[ROLLOUT_ROUTE] = RolloutRoute(
            router,
            config.rollout,
            registry,
            session_header=config.server.session_header,
            sink=rollout_sink,
            hook=rollout_guard,
        )
    proxy = Proxy(
        config.limits,
        config.upstream,
        live,
        ProxyMetrics(registry),
        tee,
        text_max=config.storage.store_text_max_chars,
        rollout=rollout,
    )
    app[CONFIG] = config
    app[LIVE] = live
    app[METRICS] = registry
    app[PROXY] = proxy
    app[READY_CHECKS] = {"live": _live_check(app)}
    app[CONNECTIONS] = stats = ConnectionStats("proxy")
    registry.add_collector(stats.prometheus_lines)
    registry.add_collector(proxy.budget.prometheus_lines)

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        # The readiness check's (one `/health` per probe): a few connections, so the descriptors
        # planned for `upstream.max_connections` stay the proxy pool's.
        session = make_client_session(
            limit=min(_READY_CONNECTIONS, config.upstream.max_connections),
            keepalive_s=config.upstream.keepalive_s,
            connect_timeout_s=config.upstream.connect_timeout_s,
        )
        app[UPSTREAM_SESSION] = session
        proxy.pool = pool = UpstreamPool(
            limit=config.upstream.max_connections,
            keepalive_s=config.upstream.keepalive_s,
            connect_timeout_s=config.upstream.connect_timeout_s,
        )
        yield
        proxy.pool = None
        proxy.sweeper.close()
        pool.close()
        await session.close()

    app.cleanup_ctx.append(upstream_ctx)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


def mount_admin(app: web.Application, admin: web.Application) -> None:
    """Serve the admin app: under `/admin` of the proxy's listener, or, with `admin_listen`, on
    its own listener (`start_gateway` starts it). Its readiness checks and metrics join the
    gateway's either way."""
    checks: dict[str, ReadyCheck] = admin.get(ADMIN_READY_CHECKS) or {}
    app[READY_CHECKS].update(checks)
    for collector in admin.get(ADMIN_COLLECTORS, []):
        app[METRICS].add_collector(collector)
    if app[CONFIG].admin.listen is None:
        app.add_subapp("/admin", admin)
    else:
        app[ADMIN_APP] = admin


def make_runner(
    app: web.Application,
    config: GatewayConfig,
    *,
    stats: ConnectionStats | None = None,
    max_connections: int | None = None,
    **kwargs: Any,
) -> web.AppRunner:
    """The runner the gateway needs: client disconnects cancel the handler (so the upstream is
    aborted at once), bodies are not decompressed (forwarded as sent), no access log, the
    connection guards of `gateway.server.connections`, and proxied requests handed to
    `Proxy.handle` without the router (`direct_dispatch`)."""
    return GatewayRunner(
        app,
        max_connections=max_connections or config.limits.max_connections,
        header_read_timeout_s=config.limits.header_read_timeout_s,
        log_interval_s=config.limits.bad_request_log_interval_s,
        stats=stats if stats is not None else app.get(CONNECTIONS) or ConnectionStats("proxy"),
        direct=proxy.handle if (proxy := app.get(PROXY)) is not None else None,
        keepalive_timeout=config.limits.keepalive_timeout_s,
        handler_cancellation=True,
        auto_decompress=False,
        access_log=None,
        shutdown_timeout=config.server.drain_timeout_s,
        **kwargs,
    )


def connection_limits(config: GatewayConfig) -> EdgeLimits:
    """Client, upstream and admin connection limits that fit the process's descriptor limit
    together (`gateway.server.limits`), so a flood on the proxy port can never take the
    descriptors the admin API and the live endpoint's pool need. Logs them in one line."""
    admin = config.admin.max_connections if config.admin.listen is not None else 0
    wanted = descriptors_wanted(
        config.limits.max_connections, config.upstream.max_connections, admin
    )
    limits = plan_limits(
        fit_file_limit(wanted),
        max_connections=config.limits.max_connections,
        upstream=config.upstream.max_connections,
        admin=admin,
    )
    fields: dict[str, object] = dict(limits._asdict())
    fields["loop"] = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    if limits.lowered:
        fields["configured_max_connections"] = config.limits.max_connections
        fields["configured_upstream_max_connections"] = config.upstream.max_connections
    message = "connection limits sized from the file descriptor limit"
    if not limits.enough:
        message += " (below the floor: raise the limit, e.g. `ulimit -n 4096`)"
    level = logging.WARNING if limits.lowered else logging.INFO
    log.log(level, message, extra={"fields": fields})
    return limits


class RunningGateway:
    """A gateway serving on a socket; `close()` stops it."""

    def __init__(self, runner: web.AppRunner, admin: web.AppRunner | None = None) -> None:
        self.runner = runner
        self.admin_runner = admin
        self.url = _url_of(runner)
        host, port = runner.addresses[0][:2]
        self.host, self.port = str(host), int(port)
        # Where the admin API answers: its own listener, or /admin of the proxy's.
        self.admin_url = (_url_of(admin) if admin is not None else self.url) + "/admin"

    @property
    def app(self) -> web.Application:
        return self.runner.app

    async def close(self) -> None:
        try:
            if self.admin_runner is not None:
                await self.admin_runner.cleanup()
        finally:
            await self.runner.cleanup()

    async def __aenter__(self) -> RunningGateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_gateway(
    config: GatewayConfig,
    *,
    live: LiveTarget | None = None,
    tee: RequestTee | None = None,
    metrics: Exporter | None = None,
    customize: Sequence[AppCustomizer] = (),
    reuse_port: bool | None = None,
    router: ArmRouter | None = None,
    rollout_sink: RolloutSink | None = None,
    rollout_guard: RolloutGuard | None = None,
) -> RunningGateway:
    """Build, start and bind a gateway on `config.server.listen` (port 0: any free port).

    The live endpoint is `live`, else `config.live.url`; with neither, ConfigError.
    """
    if live is None:
        if config.live.url is None:
            raise ConfigError("[live] url: the gateway needs a live endpoint (none configured)")
        live = LiveTarget(config.live.endpoint(config.live.url))
    limits = connection_limits(config)
    config = msgspec.structs.replace(
        config,
        limits=msgspec.structs.replace(config.limits, max_connections=limits.max_connections),
        upstream=msgspec.structs.replace(
            config.upstream, max_connections=limits.upstream_max_connections
        ),
    )
    app = build_app(
        config,
        live=live,
        tee=tee,
        metrics=metrics,
        router=router,
        rollout_sink=rollout_sink,
        rollout_guard=rollout_guard,
    )
    for fn in customize:
        fn(app)
    runner = make_runner(app, config, max_connections=limits.max_connections)
    admin_runner: web.AppRunner | None = None
    reuse = config.server.workers > 1 if reuse_port is None else reuse_port
    try:
        await runner.setup()
        site = web.TCPSite(
            runner, config.server.host, config.server.port, backlog=4096, reuse_port=reuse
        )
        await site.start()
        admin_app = app.get(ADMIN_APP)
        if admin_app is not None and config.admin.listen is not None:
            admin_runner = await _start_admin(
                admin_app, config, config.admin.max_connections, reuse, app
            )
    except BaseException:
        if admin_runner is not None:
            await admin_runner.cleanup()
        await runner.cleanup()
        raise
    return RunningGateway(runner, admin_runner)


async def _start_admin(
    admin: web.Application, config: GatewayConfig, limit: int, reuse: bool, app: web.Application
) -> web.AppRunner:
    """The admin API alone on `admin_listen`: `/admin/...` paths, nothing of the proxy."""
    assert config.admin.listen is not None
    host, port = split_host_port(config.admin.listen)
    root = web.Application()
    root.add_subapp("/admin", admin)
    stats = ConnectionStats("admin")
    app[CONNECTIONS].also.append(stats)  # exported with the proxy listener's families
    runner = make_runner(root, config, stats=stats, max_connections=limit)
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port, reuse_port=reuse).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _url_of(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"
