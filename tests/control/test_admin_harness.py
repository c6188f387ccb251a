"""A real admin API for tests, two ways: `admin_server` mounts the `/admin` sub-app on a bare
aiohttp app over real storage and a real Registry (fast, any database, fake counters);
`real_gateway` runs the whole gateway (`gateway.process.runtime.running`: proxy, mirror, writer,
registry, built-in simulator as live) on 127.0.0.1:0 with a SQLite file. Imported by the admin
and CLI tests; holds no tests itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from gateway.config.load import config_from
from gateway.control.admin.handlers import AdminContext, build_admin_app
from gateway.control.registry import Registry
from gateway.control.reports import LocalReports
from gateway.process.runtime import Components, running
from gateway.server.hooks import LiveTarget
from storage.engine import make_engine, upgrade
from tests.fixtures_net import Served, start_app

TOKEN = "tok-ci-3f9a1c"
OPS_TOKEN = "tok-ops-77b2e0"
TOKENS = {TOKEN: "ci", OPS_TOKEN: "ops"}
LIVE = Endpoint(name="prod", url="http://127.0.0.1:9/", role="live", kind="live")


@dataclass
class AdminServer:
    """A running admin API and what it was built from."""

    served: Served
    engine: AsyncEngine
    registry: Registry
    counters: dict[str, dict[str, int]]  # what the mirror would report; tests may fill it
    writer: dict[str, int]

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def admin(self) -> str:
        return self.served.url + "/admin"


async def _start_on(app: web.Application, host: str) -> Served:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    return Served(runner)


@contextlib.asynccontextmanager
async def real_gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Components]:
    """The complete gateway, admin tokens `ci` and `ops`, simulator as the live endpoint."""
    settings: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "db_url": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "admin_token": f"ci:{TOKEN},ops:{OPS_TOKEN}",
        "registry_poll_interval_s": 3600.0,
        # These tests ask for reports: the gateway waits for its report process, which runs at
        # idle priority and on a busy CI host can take longer than production's default 10 s
        # to start (tests/process/test_report_process.py covers a start that is slower still).
        "report_start_wait_s": 120.0,
        **overrides,
    }
    async with running(config_from(settings)) as parts:
        yield parts


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def admin_server(
    db_url: str,
    *,
    tokens: Mapping[str, str] | None = None,
    insecure: bool = False,
    listen_host: str = "127.0.0.1",
    bind: str = "127.0.0.1",
    **context: Any,
) -> AsyncIterator[AdminServer]:
    """Migrate `db_url` (idempotent), seed the live endpoint, start the admin API."""
    await upgrade(db_url)
    engine = make_engine(db_url)
    registry = Registry(engine, LiveTarget(LIVE), poll_interval_s=3600.0)
    try:
        await registry.start(seed_live=LIVE)
        counters: dict[str, dict[str, int]] = {}
        writer = {"queue_depth": 3, "observations_dropped": 0}
        ctx = AdminContext(
            engine=engine,
            registry=registry,
            tokens=TOKENS if tokens is None else tokens,
            insecure=insecure,
            counters=lambda: counters,
            writer_stats=lambda: writer,
            verdict_settings=VerdictSettings(),
            listen_host=listen_host,
            reports=LocalReports(engine, VerdictSettings()),
            **context,  # more AdminContext fields (the labellers, the label settings)
        )
        app = web.Application()
        app.add_subapp("/admin", build_admin_app(ctx))
        served = await start_app(app) if bind == "127.0.0.1" else await _start_on(app, bind)
        server = AdminServer(served, engine, registry, counters, writer)
        try:
            yield server
        finally:
            await server.served.close()
    finally:
        await registry.close()
        await engine.dispose()


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """One request; returns (status, decoded JSON body or None)."""
    hdrs = auth() if headers is None else dict(headers)
    async with http.request(method, url, json=json, data=data, headers=hdrs) as resp:
        raw = await resp.read()
        if not raw:
            return resp.status, None
        assert resp.content_type == "application/json", (resp.status, raw[:200])
        return resp.status, await resp.json()
