"""The admin API answers every error by its one map (`boundary.map_exception`): a failure
injected under a real handler leaves with the status, type, field, `detail` and headers the
map gives its class, and the handlers re-map nothing themselves (`detail.reason` is kept).

The failures are injected where a handler calls its use case (`Promotions.promote`), on a real
admin API on 127.0.0.1:0 over a real SQLite file, called by a real aiohttp client.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from domain import errors as de
from gateway.control.admin.boundary import (
    Forbidden,
    InvalidField,
    NotAuthenticated,
    RateLimited,
    map_exception,
)
from gateway.control.promotion import Promotions
from gateway.control.reports import ReportDoc, ReportsUnavailable
from gateway.rollout.state import RolloutRefused
from tests.control.test_admin_harness import LIVE, admin_server, auth, call

BODY = {"name": "int8", "url": "http://127.0.0.1:9001/"}
HIDDEN = "postgresql+asyncpg://canary:s3cret@db/canary"  # what an error may name, never say


def _injected() -> list[de.CanaryError]:
    return [
        de.PromotionConflict("another endpoint became live", reason="live_changed"),
        de.PromotionConflict("'int8' is already live", reason="already_live"),
        RolloutRefused("int8", ReportDoc("hold", b'{"verdict": "hold", "reasons": []}')),
        de.StorageUnavailable(f"cannot reach {HIDDEN}"),
        de.SchemaBehind("run `canary db upgrade`"),
        de.EndpointNotFound("int8"),
        de.InvalidSettings("verdict setting 'alpha' must be a number"),
        InvalidField("url: must be http or https", "url"),
        NotAuthenticated("missing or invalid bearer token"),
        Forbidden("this token may label only"),
        RateLimited("too many failed authentications", retry_after_s=7),
        ReportsUnavailable("the report process is down"),
    ]


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'admin.db'}"


@pytest.mark.parametrize("exc", _injected(), ids=lambda e: type(e).__name__)
async def test_injected_domain_error_leaves_by_the_one_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: de.CanaryError
) -> None:
    """A domain error raised under the promote handler is answered with exactly the status,
    type, field, detail and headers `map_exception` gives it, in the one JSON error shape."""

    async def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(Promotions, "promote", fail)
    want = map_exception(exc)
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        assert (await call(http, "POST", srv.admin + "/candidates", json=BODY))[0] == 201
        url = srv.admin + "/candidates/int8/promote"
        async with http.post(url, json={"force": True}, headers=auth()) as resp:
            body = await resp.json()
            assert resp.status == want.status == exc.http_status
            for name, value in (want.http_headers() or {}).items():
                assert resp.headers[name] == value
    assert set(body) == {"error"}
    err = body["error"]
    assert (err["code"], err["type"], err["message"]) == (want.status, exc.code, str(want))
    assert err.get("field") == exc.http_field
    assert err.get("detail") == exc.http_detail()
    assert HIDDEN not in str(body)


async def test_injected_bug_is_a_logged_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ValueError under a handler (a bug) is a 500 internal_error that says nothing of it,
    and the gateway log has its traceback once."""

    async def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError(f"bug near {HIDDEN}")

    monkeypatch.setattr(Promotions, "promote", fail)
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        assert (await call(http, "POST", srv.admin + "/candidates", json=BODY))[0] == 201
        with caplog.at_level(logging.ERROR, logger="canary.admin"):
            status, body = await call(
                http, "POST", srv.admin + "/candidates/int8/promote", json={"force": True}
            )
    assert status == 500
    assert body == {
        "error": {"message": "internal error (see the gateway log)", "type": "internal_error",
                  "code": 500}
    }  # fmt: skip
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and isinstance(logged[0].exc_info[1], ValueError)  # type: ignore[index]


async def test_refusals_keep_their_reason(tmp_path: Path) -> None:
    """Promoting the live endpoint and changing it are 409 conflicts whose `detail.reason`
    says why (the handlers used to answer the first without it and hard-code the second)."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = f"{srv.admin}/candidates/{LIVE.name}"
        status, body = await call(http, "POST", url + "/promote", json={"force": True})
        assert status == 409 and body["error"]["type"] == "conflict"
        assert body["error"]["detail"] == {"reason": "already_live"}
        status, body = await call(http, "PATCH", url, json={"url": "http://127.0.0.1:1/"})
        assert status == 409 and body["error"]["detail"] == {"reason": "is_live"}
        bad = {**BODY, "verdict": {"alpha": 0.9}}
        status, body = await call(http, "POST", srv.admin + "/candidates", json=bad)
        assert (status, body["error"]["type"], body["error"]["field"]) == (
            422,
            "validation_error",
            "verdict",
        )
        assert "alpha" in body["error"]["message"]
