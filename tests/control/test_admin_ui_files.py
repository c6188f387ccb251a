"""The admin page's files as the admin app serves them (the browser tests in tests/browser/
drive the page itself): public, data-free, under a strict CSP, shipped in the package."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import aiohttp

from gateway.control.admin.ui import CSP
from tests.control.test_admin_harness import admin_server, auth, call, real_gateway


def sqlite_url(tmp: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp / 'a.db'}"


async def test_files_need_no_token_and_carry_a_strict_policy(tmp_path: Path) -> None:
    """index.html, app.js and app.css answer without a token, with the CSP, nosniff and no
    referrer; the API next to them still answers 401 without one; `/ui` redirects to `/ui/`."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        for path, ctype in (("/ui/", "text/html"), ("/ui/app.js", "text/javascript"),
                            ("/ui/label.js", "text/javascript"),
                            ("/ui/human.js", "text/javascript"),
                            ("/ui/app.css", "text/css")):  # fmt: skip
            async with http.get(srv.admin + path) as resp:
                assert resp.status == 200, path
                assert resp.content_type == ctype
                assert resp.headers["Content-Security-Policy"] == CSP
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert resp.headers["Referrer-Policy"] == "no-referrer"
                assert resp.headers["X-Frame-Options"] == "DENY"
        async with http.get(srv.admin + "/ui", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/admin/ui/"
        status, body = await call(http, "GET", srv.admin + "/ui/secrets.json", headers={})
        assert status == 404 and body["error"]["type"] == "not_found"
        assert (await call(http, "GET", srv.admin + "/candidates", headers={}))[0] == 401


async def test_page_is_404_when_the_admin_api_is_disabled(tmp_path: Path) -> None:
    """No token and no --insecure-admin: the page is as absent as the API."""
    async with (
        admin_server(sqlite_url(tmp_path), tokens={}) as srv,
        aiohttp.ClientSession() as http,
    ):
        for path in ("/ui/", "/ui/app.js"):
            async with http.get(srv.admin + path, headers=auth()) as resp:
                assert resp.status == 404


async def test_page_says_whether_the_api_needs_a_token(tmp_path: Path) -> None:
    """The served page states "token" when the admin API takes tokens and "open" under
    --insecure-admin (so it shows no prompt there); the API answers it without one then."""
    meta = re.compile(r'<meta name="canary-admin-auth" content="(\w+)">')
    for tokens, insecure, expected in ((None, False, "token"), ({}, True, "open")):
        async with (
            admin_server(sqlite_url(tmp_path), tokens=tokens, insecure=insecure) as srv,
            aiohttp.ClientSession() as http,
        ):
            async with http.get(srv.admin + "/ui/") as resp:
                found = meta.search(await resp.text())
            assert found is not None and found.group(1) == expected
            status = (await call(http, "GET", srv.admin + "/status", headers={}))[0]
            assert status == (200 if insecure else 401)


def test_page_loads_nothing_from_elsewhere_and_runs_no_inline_script() -> None:
    """Every asset the HTML names is one of the page's own files; no inline script or style;
    the JavaScript sends the token only as a header and reads only the admin API."""
    static = resources.files("gateway.control.admin").joinpath("static")
    html = static.joinpath("index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert sorted(refs) == ["app.css", "app.js", "data:,", "human.js", "label.js"]
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)
    assert "<style" not in html and " style=" not in html
    js = static.joinpath("app.js").read_text()
    assert "Authorization: `Bearer ${token}`" in js
    assert "sessionStorage" in js and "localStorage" not in js
    assert not re.search(r"https?://", js.replace("http://www.w3.org/2000/svg", ""))
    assert "innerHTML" not in js and "eval(" not in js
    label = static.joinpath("label.js").read_text()  # the labelling view: a pair as plain text
    assert "innerHTML" not in label and "eval(" not in label and "dataset.order" not in label
    assert not re.search(r"https?://", label)
    human = static.joinpath("human.js").read_text()  # what people prefer: text only
    assert "innerHTML" not in human and "eval(" not in human
    assert not re.search(r"https?://", human)


async def test_page_goes_where_the_admin_app_goes(tmp_path: Path) -> None:
    """With `admin_listen` the page is served on the admin listener, next to the API it calls;
    the production port does not serve it (forwarded to the live endpoint like any path)."""
    async with real_gateway(tmp_path, admin_listen="127.0.0.1:0") as parts:
        gw = parts.gateway
        assert gw is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.admin_url + "/ui/") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Security-Policy"] == CSP
                assert 'src="app.js"' in await resp.text()
            async with http.get(gw.url + "/admin/ui/") as resp:
                assert "Content-Security-Policy" not in resp.headers
