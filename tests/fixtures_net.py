"""Shared network fixtures: real servers on 127.0.0.1:0 and both event loops.

- `both_loops_policy`: assigned as `event_loop_policy` in a test module (with
  `pytestmark = BOTH_LOOPS`), runs its async tests on asyncio's default loop and on uvloop.
- `serve`: starts an aiohttp `web.Application` on 127.0.0.1:0 and returns a `Served` handle with
  its `url`; every server is closed at teardown.
- `http`: a plain `aiohttp.ClientSession` closed at teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is optional at run time
    uvloop = None

POLICIES: dict[str, Callable[[], asyncio.AbstractEventLoopPolicy]] = {
    "asyncio": asyncio.DefaultEventLoopPolicy
}
if uvloop is not None:
    POLICIES["uvloop"] = uvloop.EventLoopPolicy

# pytest-asyncio deprecates overriding `event_loop_policy` in favour of a global loop-factory
# hook; that hook re-parametrizes every async test in the suite (and breaks module-scoped async
# fixtures elsewhere), so the opt-in, per-module override stays, with its warning silenced here.
BOTH_LOOPS = pytest.mark.filterwarnings(
    'ignore:Overriding the "event_loop_policy" fixture:pytest.PytestDeprecationWarning'
)


@pytest.fixture(scope="module", params=list(POLICIES))
def both_loops_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Opt-in in a test module with `event_loop_policy = fixtures_net.both_loops_policy` and
    `pytestmark = fixtures_net.BOTH_LOOPS`: its async tests run on asyncio's loop and on uvloop."""
    return POLICIES[request.param]()


class Served:
    """An aiohttp app listening on 127.0.0.1 on a free port."""

    def __init__(self, runner: web.AppRunner) -> None:
        self.runner = runner
        host, port = runner.addresses[0][:2]
        self.port = int(port)
        self.url = f"http://{host}:{port}"

    @property
    def app(self) -> web.Application:
        return self.runner.app

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_app(app: web.Application, **runner_kwargs: Any) -> Served:
    """Start `app` on 127.0.0.1:0 (no access log unless asked) and return its handle."""
    runner_kwargs.setdefault("access_log", None)
    runner_kwargs.setdefault("shutdown_timeout", 1.0)
    runner = web.AppRunner(app, **runner_kwargs)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    except BaseException:
        await runner.cleanup()
        raise
    return Served(runner)


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    """`await serve(app, **runner_kwargs)` -> Served; all are closed at teardown."""
    servers: list[Served] = []

    async def _serve(app: web.Application, **runner_kwargs: Any) -> Served:
        served = await start_app(app, **runner_kwargs)
        servers.append(served)
        return served

    yield _serve
    for served in reversed(servers):
        await served.close()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session for the test, closed at teardown."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture
async def gateway() -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """`await gateway(live_url, tee=None, **config)` -> a running gateway on 127.0.0.1:0."""
    from gateway.config.load import config_from
    from gateway.server.app import RunningGateway, start_gateway

    running: list[RunningGateway] = []

    async def _gateway(live_url: str | None, *, tee: Any = None, **config: Any) -> RunningGateway:
        settings = {"listen": "127.0.0.1:0", "live_url": live_url, **config}
        cfg = config_from(settings)
        gw = await start_gateway(cfg, tee=tee)
        running.append(gw)
        return gw

    yield _gateway
    for gw in reversed(running):
        await gw.close()
