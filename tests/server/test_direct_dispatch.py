"""The proxy's requests skip aiohttp's router only when the router would pick the proxy anyway."""

from __future__ import annotations

from aiohttp import web

from gateway.server.connections import direct_dispatch


async def _ok(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


def _app(*middlewares: object) -> web.Application:
    app = web.Application(middlewares=middlewares)  # type: ignore[arg-type]
    app.router.add_get("/healthz", _ok)
    app.router.add_route("*", "/{tail:.*}", _ok)
    app.add_subapp("/admin", web.Application())
    return app


def test_plain_app_gets_the_direct_handler() -> None:
    """With only plain routes, sub-app prefixes and the catch-all, the server gets the direct
    dispatcher; without a direct handler it keeps the app's router."""
    app = _app()
    assert direct_dispatch(app, _ok) != app._handle
    assert direct_dispatch(app, None) == app._handle


def test_middlewares_signals_or_dynamic_routes_keep_the_router() -> None:
    """A middleware, an on_response_prepare signal or a dynamic route sends every request
    through the router, so none of them is ever skipped."""

    @web.middleware
    async def mw(request: web.Request, handler: object) -> web.StreamResponse:
        return await handler(request)  # type: ignore[operator,no-any-return]

    with_mw = _app(mw)
    assert direct_dispatch(with_mw, _ok) == with_mw._handle
    signalled = _app()

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        return None

    signalled.on_response_prepare.append(on_prepare)
    assert direct_dispatch(signalled, _ok) == signalled._handle
    dynamic = _app()
    dynamic.router.add_get("/items/{id}", _ok)
    assert direct_dispatch(dynamic, _ok) == dynamic._handle
