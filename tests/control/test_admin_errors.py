"""Every refusal of the admin API: 400, 401, 404, 405, 409, 413 and 422, always in the one error
shape, and secrets never echoed, returned or logged."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from domain.errors import ConfigError
from evaluators.judge.settings import VerdictSettings
from gateway.control.admin.auth import is_loopback
from gateway.control.admin.handlers import AdminContext, build_admin_app
from tests.control.test_admin_harness import LIVE, OPS_TOKEN, TOKEN, admin_server, auth, call
from tests.fixtures_db import Outage

BODY = {"name": "int8", "url": "http://127.0.0.1:9001/"}
GRADER = {"url": "http://127.0.0.1:9002", "model": "judge"}


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'admin.db'}"


def assert_error(body: Any, status: int, type_: str | None = None) -> None:
    assert set(body) == {"error"}
    err = body["error"]
    assert err["code"] == status and isinstance(err["message"], str) and err["message"]
    assert set(err) <= {"message", "type", "code", "field", "detail"}
    if type_ is not None:
        assert err["type"] == type_


async def test_token_required(tmp_path: Path) -> None:
    """No token, a wrong one or another scheme is 401 with a Bearer challenge; each listed
    `label:token` works and its label is the actor of a promotion."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        for headers in (
            {},
            auth("nope"),
            auth(TOKEN + "x"),
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": "Bearer"},
            {"Authorization": "Bearer ünïcode"},
        ):
            async with http.get(url, headers=headers) as resp:
                assert resp.status == 401, headers
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                assert_error(await resp.json(), 401, "authentication_error")
        assert (await call(http, "GET", url, headers=auth(TOKEN)))[0] == 200
        assert (await call(http, "GET", url, headers={"authorization": f"bearer {OPS_TOKEN}"}))[
            0
        ] == 200
        await call(http, "POST", url, json=BODY)
        _, res = await call(
            http, "POST", url + "/int8/promote", json={"force": True}, headers=auth(OPS_TOKEN)
        )
        assert res["promotion"]["actor"] == "ops"


async def test_openapi_needs_no_token(tmp_path: Path) -> None:
    """The OpenAPI document is public once the API is enabled; the rest still needs a token."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        status, doc = await call(http, "GET", srv.admin + "/openapi.json", headers={})
        assert status == 200 and doc["openapi"].startswith("3.1")
        assert (await call(http, "GET", srv.admin + "/status", headers={}))[0] == 401


async def test_disabled_without_token(tmp_path: Path) -> None:
    """With no token configured and no --insecure-admin every admin path is 404."""
    async with (
        admin_server(sqlite_url(tmp_path), tokens={}) as srv,
        aiohttp.ClientSession() as http,
    ):
        for method, path in (
            ("GET", "/candidates"),
            ("POST", "/candidates"),
            ("GET", "/openapi.json"),
            ("POST", "/rollback"),
        ):
            status, body = await call(http, method, srv.admin + path, headers=auth())
            assert status == 404
            assert_error(body, 404, "not_found")


async def test_insecure_on_loopback(tmp_path: Path) -> None:
    """--insecure-admin without a token serves loopback clients, recording the actor as such."""
    async with (
        admin_server(sqlite_url(tmp_path), tokens={}, insecure=True) as srv,
        aiohttp.ClientSession() as http,
    ):
        assert (await call(http, "POST", srv.admin + "/candidates", json=BODY, headers={}))[
            0
        ] == 201
        _, res = await call(
            http, "POST", srv.admin + "/candidates/int8/promote", json={"force": True}, headers={}
        )
        assert res["promotion"]["actor"] == "insecure-admin"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example", "", None])
def test_insecure_refused_on_public_listener(host: str | None) -> None:
    """Building the admin app with --insecure-admin on a non-loopback listener is a ConfigError."""
    ctx = AdminContext(
        engine=None,  # type: ignore[arg-type]  # never reached: the check comes first
        registry=None,  # type: ignore[arg-type]
        tokens={},
        insecure=True,
        counters=dict,
        writer_stats=dict,
        verdict_settings=VerdictSettings(),
        listen_host=host,
        reports=None,  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigError, match="loopback"):
        build_admin_app(ctx)


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"sample_rate": 1.5}, "sample_rate", "<= 1.0"),
        ({"sample_rate": -0.1}, "sample_rate", ">= 0.0"),
        ({"sample_rate": "0.5"}, "sample_rate", "got `str`"),
        ({"target_rps": 0}, "target_rps", "> 0.0"),
        ({"target_rps": -3}, "target_rps", "> 0.0"),
        ({"target_rps": 2e6}, "target_rps", "<= 1000000.0"),
        ({"target_rps": "20"}, "target_rps", "got `str`"),
        ({"url": "ftp://host/"}, "url", "http(s)"),
        ({"url": "http://user:pw@host/"}, "url", "user:password@"),
        ({"url": "http://host:99999/"}, "url", "port"),
        ({"url": "not a url"}, "url", "http(s)"),
        ({"name": "Bad Name"}, "name", "lowercase"),
        ({"name": "x" * 64}, "name", "lowercase"),
        ({"buffer_max_items": 0}, "buffer_max_items", ">= 1"),
        ({"buffer_max_bytes": -5}, "buffer_max_bytes", ">= 1"),
        ({"concurrency": 0}, "concurrency", ">= 1"),
        ({"timeout_s": 0}, "timeout_s", ">= 0.001"),
        ({"gpus": 1.5}, "gpus", "got `float`"),
        ({"price_per_hour_usd": -1}, "price_per_hour_usd", ">= 0.0"),
        ({"sampling": "sometimes"}, "sampling", "enum"),
        ({"state": "on"}, "state", "enum"),
        ({"kind": "a\x00b"}, "kind", "control"),
        ({"credentials_env": "sk-live-9f8e7d"}, "credentials_env", "never the secret"),
        ({"verdict": {"no_such_setting": 1}}, "verdict", "unknown verdict setting"),
        ({"verdict": {"alpha": 0.9}}, "verdict", "alpha"),
        ({"verdict": {"Alpha": 0.1}}, "verdict", "verdict setting names"),
        ({"role": "live"}, "role", "unknown field"),
        ({"grader": {**GRADER, "url": "ftp://judge:21"}}, "grader.url", "http(s)"),
        ({"grader": {**GRADER, "rate": 0}}, "grader.rate", "> 0"),
        ({"grader": {**GRADER, "rate": 1.5}}, "grader.rate", "<= 1"),
        ({"grader": {**GRADER, "swap_rate": -0.1}}, "grader.swap_rate", ">= 0"),
        ({"grader": {**GRADER, "max_per_minute": -1}}, "grader.max_per_minute", ">= 1"),
        ({"grader": {**GRADER, "daily_token_budget": -5}}, "grader.daily_token_budget", ">="),
        ({"grader": {**GRADER, "price_per_mtok": -1.0}}, "grader.price_per_mtok", ">= 0"),
        (
            {"grader": {**GRADER, "prompt": "Which is better? {answer_a}"}},
            "grader.prompt",
            "{answer_b}",
        ),
        (
            {"grader": {**GRADER, "credentials_env": "DATABASE_URL"}},
            "grader.credentials_env",
            "meant for candidates",
        ),
        ({"grader": {"url": "http://judge:8000"}}, "grader.model", "missing"),
        ({"api_key": "sk-abc"}, "api_key", "credentials_env"),
        ({"color": "red"}, "color", "unknown field"),
    ],
)
async def test_create_validation(
    tmp_path: Path, patch: dict[str, Any], field: str, words: str
) -> None:
    """A bad body is 422 naming the field and the reason, and nothing is stored."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        status, body = await call(http, "POST", srv.admin + "/candidates", json={**BODY, **patch})
        assert status == 422, body
        assert_error(body, 422, "validation_error")
        assert body["error"]["field"] == field
        assert words in body["error"]["message"]
        assert srv.registry.snapshot.candidates == ()


async def test_missing_and_malformed(tmp_path: Path) -> None:
    """A missing required field is 422; a body that is not JSON is 400; not an object is 422."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        status, body = await call(http, "POST", url, json={"url": BODY["url"]})
        assert status == 422 and body["error"]["field"] == "name"
        for raw in (b"{bad", b"", b'{"name": "a", ', b"\xff\xfe"):
            status, body = await call(http, "POST", url, data=raw)
            assert status == 400, raw
            assert_error(body, 400, "invalid_json")
        status, body = await call(http, "POST", url, data=b"[1, 2]")
        assert status == 422 and "object" in body["error"]["message"]
        await call(http, "POST", url, json=BODY)
        status, body = await call(http, "PATCH", url + "/int8", data=b"{")
        assert status == 400
        status, body = await call(http, "PATCH", url + "/int8", json={"name": "other"})
        assert status == 422 and body["error"]["field"] == "name"
        status, body = await call(http, "POST", url + "/int8/promote", data=b"nope")
        assert status == 400
        status, body = await call(http, "POST", url + "/int8/promote", json={"force": "yes"})
        assert status == 422 and body["error"]["field"] == "force"


async def test_body_too_large(tmp_path: Path) -> None:
    """A body over the admin limit is refused with 413 before it is parsed."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        big = b'{"name": "' + b"a" * 100_000 + b'"}'
        status, body = await call(http, "POST", srv.admin + "/candidates", data=big)
        assert status == 413
        assert_error(body, 413, "payload_too_large")


async def test_unknown_names_and_paths(tmp_path: Path) -> None:
    """An unknown name is 404 on every per-name route; unknown paths 404; wrong methods 405."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        base = srv.admin + "/candidates/ghost"
        for method, url, body in (
            ("GET", base, None),
            ("PATCH", base, {"state": "paused"}),
            ("DELETE", base, None),
            ("POST", base + "/promote", {"force": True}),
            ("GET", srv.admin + "/no/such/path", None),
        ):
            status, err = await call(http, method, url, json=body)
            assert status == 404, (method, url)
            assert_error(err, 404, "not_found")
        status, err = await call(http, "PUT", srv.admin + "/candidates", json=BODY)
        assert status == 405
        assert_error(err, 405, "method_not_allowed")


async def test_conflicts(tmp_path: Path) -> None:
    """Duplicates (also of the live name), changing or deleting the live endpoint, promoting
    it, and a rollback with nothing to undo are 409."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        assert (await call(http, "POST", url, json=BODY))[0] == 201
        for body in (BODY, {**BODY, "name": LIVE.name}):
            status, err = await call(http, "POST", url, json=body)
            assert status == 409
            assert_error(err, 409, "conflict")
            assert "already exists" in err["error"]["message"]
        changes: tuple[tuple[str, str, dict[str, object] | None], ...] = (
            ("DELETE", f"/{LIVE.name}", None),
            ("PATCH", f"/{LIVE.name}", {"url": "http://127.0.0.1:1/"}),
            ("POST", f"/{LIVE.name}/promote", {"force": True}),
        )
        for method, path, change in changes:
            status, err = await call(http, method, url + path, json=change)
            assert status == 409, (method, path)
            assert_error(err, 409)
        status, err = await call(http, "POST", srv.admin + "/rollback")
        assert status == 409 and err["error"]["detail"] == {"reason": "nothing_to_roll_back"}


async def test_secrets_never_returned_or_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the env var's name is stored and returned; a raw secret sent in any field is
    refused without being echoed, and neither it nor a token reaches the log."""
    secret = "sk-live-VERYSECRET-0123456789"
    monkeypatch.setenv("CANARY_CANDIDATE_INT8_KEY", secret)
    caplog.set_level(logging.DEBUG)
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        seen: list[str] = []
        for extra in ({"api_key": secret}, {"credentials": secret}, {"credentials_env": secret}):
            async with http.post(url, json={**BODY, **extra}, headers=auth()) as resp:
                assert resp.status == 422
                seen.append(await resp.text())
        async with http.post(
            url, json={**BODY, "credentials_env": "CANARY_CANDIDATE_INT8_KEY"}, headers=auth()
        ) as resp:
            assert resp.status == 201
            seen.append(await resp.text())
        for path in ("/candidates", "/candidates/int8", "/status"):
            async with http.get(srv.admin + path, headers=auth()) as resp:
                seen.append(await resp.text())
        async with http.post(url + "/int8/promote", json={"force": True}, headers=auth()) as r:
            seen.append(await r.text())
    assert all(secret not in text for text in seen)
    assert all(TOKEN not in text for text in seen)
    assert '"credentials_env":"CANARY_CANDIDATE_INT8_KEY"' in seen[3]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert secret not in logged and TOKEN not in logged


async def test_storage_outage(db_url: str, db_outage: Outage) -> None:
    """While the database refuses service, changes are 503 in the error shape (never a false
    2xx) and `/status` still answers from the loaded registry; afterwards all works again."""
    async with admin_server(db_url) as srv, aiohttp.ClientSession() as http:
        async with db_outage(db_url, reads=True):
            status, body = await call(http, "POST", srv.admin + "/candidates", json=BODY)
            assert status == 503
            assert_error(body, 503, "storage_unavailable")
            status, body = await call(http, "GET", srv.admin + "/status")
            assert status == 200
            assert body["storage_ok"] is False and body["live"]["name"] == LIVE.name
        assert (await call(http, "POST", srv.admin + "/candidates", json=BODY))[0] == 201
        _, body = await call(http, "GET", srv.admin + "/status")
        assert body["storage_ok"] is True


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("::ffff:192.0.2.7", False),
        ("localhost.example", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_detection(host: str | None, loopback: bool) -> None:
    """What counts as a loopback listener or peer for --insecure-admin."""
    assert is_loopback(host) is loopback


def _outward_ipv4() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        addr: str = probe.getsockname()[0]
    return None if is_loopback(addr) else addr


async def test_insecure_refuses_non_loopback_peers(tmp_path: Path) -> None:
    """Even if an insecure admin API were reachable from outside, a non-loopback peer gets 404."""
    addr = _outward_ipv4()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    async with (
        admin_server(sqlite_url(tmp_path), tokens={}, insecure=True, bind="0.0.0.0") as srv,
        aiohttp.ClientSession() as http,
    ):
        outside = f"http://{addr}:{srv.served.port}/admin/candidates"
        status, body = await call(http, "GET", outside, headers={})
        assert status == 404
        assert_error(body, 404, "not_found")
        inside = f"http://127.0.0.1:{srv.served.port}/admin/candidates"
        assert (await call(http, "GET", inside, headers={}))[0] == 200
