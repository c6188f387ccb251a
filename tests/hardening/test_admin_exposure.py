"""Admin exposure and unseen data loss (issue items 9 and 10): a separate admin listener, the
token length rule, counted failed logins with a per-peer back-off, a deleted database file
noticed by `/readyz` and refused by admin writes, and read-only commands that never create a
database; a complete gateway on real sockets and a real SQLite file."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from gateway.cli.main import main
from tests.control.test_admin_harness import OPS_TOKEN, TOKEN, admin_server, auth, real_gateway

BODY = {"name": "bikv", "url": "http://127.0.0.1:9/v1"}


async def test_admin_on_its_own_listener(tmp_path: Path) -> None:
    """With `admin_listen`, the admin API answers there, `/admin/...` on the production port
    is not the admin API (forwarded like any path: no 401 tells it exists), and `/metrics`
    exports both listeners' series in one block per family."""
    async with real_gateway(tmp_path, admin_listen="127.0.0.1:0") as parts:
        gw = parts.gateway
        assert gw is not None and gw.admin_url != gw.url + "/admin"
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.admin_url + "/status", headers=auth()) as resp:
                assert resp.status == 200
            async with http.get(gw.url + "/admin/status") as resp:
                assert resp.status != 401
                assert "canary-admin" not in resp.headers.get("WWW-Authenticate", "")
            async with http.get(gw.url + "/metrics") as resp:
                text = await resp.text()
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))  # one block per family, both listeners in it
    assert 'canary_connections_refused_total{listener="admin"} 0' in text


def test_short_admin_token_stops_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`canary serve` with a one-character admin token exits 2 naming the rule, never the
    token."""
    monkeypatch.setenv("CANARY_ADMIN_TOKEN", "ops:z")
    db = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    code = main(["serve", "--listen", "127.0.0.1:0", "--db", db])
    err = capsys.readouterr().err
    assert code == 2
    assert "admin.token_min_length" in err and "ops:z" not in err


async def test_failed_logins_are_counted_and_backed_off(tmp_path: Path) -> None:
    """After 10 failed logins from one address the next attempts get 429 with Retry-After,
    even with the right token; the failures are counted."""
    async with (
        admin_server(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as srv,
        aiohttp.ClientSession() as http,
    ):
        url = srv.admin + "/status"
        for _ in range(10):
            async with http.get(url, headers=auth("wrong-token-guess")) as resp:
                assert resp.status == 401
        async with http.get(url, headers=auth("wrong-token-guess")) as resp:
            assert resp.status == 401  # the 11th failure arms the back-off
        async with http.get(url, headers=auth(TOKEN)) as resp:
            assert resp.status == 429
            assert int(resp.headers["Retry-After"]) >= 1
    assert OPS_TOKEN


async def test_failed_logins_reach_metrics(tmp_path: Path) -> None:
    """A failed admin login on a complete gateway shows in
    `canary_admin_auth_failures_total`."""
    async with real_gateway(tmp_path) as parts, aiohttp.ClientSession() as http:
        async with http.get(parts.url + "/admin/status", headers=auth("nope-nope")) as resp:
            assert resp.status == 401
        async with http.get(parts.url + "/metrics") as resp:
            assert "canary_admin_auth_failures_total 1" in await resp.text()


async def test_deleted_database_file_is_noticed(tmp_path: Path) -> None:
    """Deleting the SQLite file under a running gateway makes `/readyz` answer 503 and admin
    changes answer 503 (never a 201 that vanishes at exit)."""
    async with real_gateway(tmp_path) as parts, aiohttp.ClientSession() as http:
        async with http.get(parts.url + "/readyz") as resp:
            assert resp.status == 200
        os.unlink(tmp_path / "gateway.db")
        async with http.get(parts.url + "/readyz") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["checks"]["database_file"]["ok"] is False
        url = parts.url + "/admin/candidates"
        async with http.post(url, json=BODY, headers=auth()) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["type"] == "storage_unavailable"


@pytest.mark.parametrize(
    "argv", [["report", "bikv"], ["db", "current"]], ids=["report", "db-current"]
)
def test_read_only_commands_never_create_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`canary report` and `canary db current` on a missing SQLite path exit 2 and create no
    file."""
    path = tmp_path / "missing.db"
    code = main([*argv, "--db", f"sqlite+aiosqlite:///{path}"])
    assert code == 2
    assert "no database" in capsys.readouterr().err
    assert not path.exists()
