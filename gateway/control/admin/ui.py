"""The live page of the admin application: `/admin/ui/`, a static HTML/JS/CSS client of the
admin JSON API.

The page holds no data of its own: the browser reads `GET /admin/candidates`, `/admin/status`,
`/admin/rollout` and one candidate's `GET /admin/candidates/{name}/report` (exactly what the
report path computes), draws the intervals and the ramp's weight in SVG, and promotes, rolls
back or steers a ramp through the same endpoints `canary promote` and `canary rollout` use, so
the API gates and audits every change. Wherever the admin app runs,
the page goes with it.

The page's files are served without authentication (they reveal nothing: no names, no
numbers). When the admin API takes tokens, every API call the page makes carries the
operator's bearer token, typed into the page, kept in the tab's sessionStorage and sent only as
an `Authorization` header, never in a URL; when it is open (`insecure_admin`, loopback only)
the page asks for nothing. Which of the two is written into the page once, at start-up (a
`<meta>` value: the page learns it without a probe that would count as a failed login). A
strict Content-Security-Policy forbids every asset from elsewhere and any inline script.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

# Route names the admin boundary serves without a token (see `is_public`).
ROUTE_PREFIX = "ui"
PAGE_PATH = "/ui/"  # the page, under the admin app's mount point (`/admin`)
_FILES = {  # served name -> content type
    "index.html": "text/html",
    "app.js": "text/javascript",
    "label.js": "text/javascript",
    "human.js": "text/javascript",
    "app.css": "text/css",
}
# Nothing from elsewhere, no inline script or style, no framing, no forms posted anywhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def is_public(route_name: str | None) -> bool:
    """True for the page's own files (served without a token; they hold no data)."""
    return bool(route_name) and str(route_name).startswith(ROUTE_PREFIX)


# index.html's placeholder for whether API calls need a token: "token" or "open".
_AUTH_MARK = b"__CANARY_ADMIN_AUTH__"


def _load(token_required: bool) -> dict[str, bytes]:
    static = resources.files("gateway.control.admin").joinpath("static")
    files = {name: static.joinpath(name).read_bytes() for name in _FILES}
    auth = b"token" if token_required else b"open"
    files["index.html"] = files["index.html"].replace(_AUTH_MARK, auth)
    return files


def add_routes(router: web.UrlDispatcher, *, token_required: bool = True) -> None:
    """Add `/ui`, `/ui/` and `/ui/{file}` to the admin sub-app's router (read once, kept in
    memory: five small files). `token_required` is False for an open admin API
    (`insecure_admin`): the page then shows no token prompt."""
    files = _load(token_required)

    def serve(name: str) -> web.Response:
        return web.Response(body=files[name], content_type=_FILES[name], headers=HEADERS)

    async def index(_request: web.Request) -> web.Response:
        return serve("index.html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in files or name == "index.html":
            raise web.HTTPNotFound()
        return serve(name)

    async def to_slash(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.path + "/")

    router.add_get("/ui", to_slash, name="ui_redirect")
    router.add_get(PAGE_PATH, index, name="ui_index")
    router.add_get("/ui/{file}", asset, name="ui_asset")
