"""Promote and roll back through the admin API: the audit row, the registry swap, and races
between replicas sharing one database (exactly one promote wins)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from storage import queries
from tests.control.test_admin_harness import LIVE, admin_server, call

BODY = {"name": "int8", "url": "http://127.0.0.1:9001/"}


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'admin.db'}"


async def test_forced_promote_then_rollback(tmp_path: Path) -> None:
    """A forced promote makes the candidate live at once, retires the old live endpoint, writes
    the audit row; rollback restores it and a second rollback has nothing left to undo."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json=BODY)
        status, res = await call(
            http,
            "POST",
            srv.admin + "/candidates/int8/promote",
            json={"force": True, "reason": "incident 4711"},
        )
        assert status == 200
        promo = res["promotion"]
        assert (promo["action"], promo["from_endpoint"], promo["to_endpoint"]) == (
            "promote",
            LIVE.name,
            "int8",
        )
        assert promo["actor"] == "ci" and promo["reason"] == "incident 4711"
        assert promo["forced"] is True
        assert res["live"]["name"] == "int8" and res["live"]["role"] == "live"
        assert srv.registry.snapshot.live.name == "int8"  # applied on this replica already
        _, old = await call(http, "GET", f"{srv.admin}/candidates/{LIVE.name}")
        assert old["role"] == "retired"

        status, res = await call(http, "POST", srv.admin + "/rollback", json={"reason": "oops"})
        assert status == 200
        assert res["promotion"]["action"] == "rollback"
        assert res["promotion"]["to_endpoint"] == LIVE.name
        assert srv.registry.snapshot.live.name == LIVE.name
        audit = await queries.list_promotions(srv.engine, 10)
        assert [(p.action, p.actor, p.reason) for p in audit] == [
            ("rollback", "ci", "oops"),
            ("promote", "ci", "incident 4711"),
        ]
        assert (await call(http, "POST", srv.admin + "/rollback"))[0] == 409


async def test_rollback_body_is_optional(tmp_path: Path) -> None:
    """`POST /rollback` and `/promote` accept an empty body (all fields have defaults)."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json=BODY)
        await call(http, "POST", srv.admin + "/candidates/int8/promote", json={"force": True})
        status, res = await call(http, "POST", srv.admin + "/rollback", data=b"")
        assert status == 200 and res["promotion"]["reason"] == ""


async def test_concurrent_promotes_of_one_candidate(db_url: str) -> None:
    """Two replicas promoting the same candidate at once: exactly one 200, the other 409."""
    async with (
        admin_server(db_url) as a,
        admin_server(db_url) as b,
        aiohttp.ClientSession() as http,
    ):
        await call(http, "POST", a.admin + "/candidates", json=BODY)
        for _ in range(3):
            results = await asyncio.gather(
                *(
                    call(http, "POST", srv.admin + "/candidates/int8/promote", json={"force": True})
                    for srv in (a, b, a, b)
                )
            )
            statuses = sorted(status for status, _ in results)
            assert statuses == [200, 409, 409, 409], results
            assert (await call(http, "POST", a.admin + "/rollback"))[0] == 200
            # rolled back, int8 is retired: bring it back as a candidate for the next round
            back = await call(
                http, "PATCH", b.admin + "/candidates/int8", json={"role": "candidate"}
            )
            assert back[0] == 200
        audit = await queries.list_promotions(a.engine, 100)
        assert [p.action for p in audit] == ["rollback", "promote"] * 3


async def test_concurrent_promotes_of_different_candidates(db_url: str) -> None:
    """Two candidates promoted at once against the same live endpoint: exactly one wins; the
    loser is told the live endpoint changed under it instead of silently replacing the winner."""
    async with (
        admin_server(db_url) as a,
        admin_server(db_url) as b,
        aiohttp.ClientSession() as http,
    ):
        await call(http, "POST", a.admin + "/candidates", json=BODY)
        await call(http, "POST", a.admin + "/candidates", json={**BODY, "name": "bikv"})
        results = await asyncio.gather(
            call(http, "POST", a.admin + "/candidates/int8/promote", json={"force": True}),
            call(http, "POST", b.admin + "/candidates/bikv/promote", json={"force": True}),
        )
        statuses = sorted(status for status, _ in results)
        assert statuses == [200, 409], results
        winner = next(body for status, body in results if status == 200)
        live = winner["live"]["name"]
        await a.registry.refresh()
        await b.registry.refresh()
        assert a.registry.snapshot.live.name == b.registry.snapshot.live.name == live
        assert len(await queries.list_promotions(a.engine, 10)) == 1
