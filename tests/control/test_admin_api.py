"""The admin REST API on a real socket and a real database: CRUD, validation, the error shape,
durability across restarts and immediate application on this replica."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.control.test_admin_harness import LIVE, admin_server, auth, call

BODY = {"name": "int8", "url": "http://127.0.0.1:9001/", "kind": "quantized"}


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'admin.db'}"


async def test_create_get_list(tmp_path: Path) -> None:
    """A registered candidate is answered 201 with its config, listed, and shown with counters."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        srv.counters["int8"] = {
            "sampled": 7,
            "sent": 5,
            "pending": 2,
            "buffer_items": 2,
            "buffer_bytes": 2048,
            "custom_extra": 1,
        }
        async with http.post(srv.admin + "/candidates", json=BODY, headers=auth()) as resp:
            status, body = resp.status, await resp.json()
            assert resp.headers["Location"] == "/admin/candidates/int8"
        assert status == 201
        assert body["name"] == "int8" and body["role"] == "candidate"
        assert body["sample_rate"] == 0.1 and body["buffer_max_items"] == 1024
        assert body["version"] == 1

        status, listed = await call(http, "GET", srv.admin + "/candidates")
        assert status == 200
        assert [c["name"] for c in listed["candidates"]] == ["int8"]  # the live one is not listed

        status, shown = await call(http, "GET", srv.admin + "/candidates/int8")
        assert status == 200
        assert shown["counters"]["sampled"] == 7 and shown["counters"]["pending"] == 2
        assert shown["buffer"] == {
            "items": 2,
            "max_items": 1024,
            "bytes": 2048,
            "max_bytes": 64 << 20,
            "fill_ratio": round(2 / 1024, 4),
        }


async def test_create_defaults_match_config_file(tmp_path: Path) -> None:
    """Omitted fields take the same defaults as a `[[candidates]]` table of the config file."""
    from gateway.config.sections import CandidateConfig

    expected = CandidateConfig(name="int8", url=BODY["url"]).to_endpoint()
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        _, body = await call(
            http, "POST", srv.admin + "/candidates", json={"name": "int8", "url": BODY["url"]}
        )
    for field in (
        "sample_rate",
        "sampling",
        "buffer_max_items",
        "buffer_max_bytes",
        "concurrency",
        "timeout_s",
        "gpus",
        "state",
        "forward_auth",
        "model",
    ):
        assert body[field] == getattr(expected, field), field


async def test_change_is_applied_on_this_replica_at_once(tmp_path: Path) -> None:
    """After a 2xx the replica's registry snapshot already holds the change (no poll needed)."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json=BODY)
        assert [c.name for c in srv.registry.snapshot.candidates] == ["int8"]
        await call(http, "PATCH", srv.admin + "/candidates/int8", json={"state": "paused"})
        assert srv.registry.snapshot.candidates[0].state == "paused"
        await call(http, "DELETE", srv.admin + "/candidates/int8")
        assert srv.registry.snapshot.candidates == ()


async def test_changes_survive_a_restart(db_url: str) -> None:
    """Create, patch and promote on one app; a new app on the same database sees all of it."""
    async with admin_server(db_url) as first, aiohttp.ClientSession() as http:
        assert (await call(http, "POST", first.admin + "/candidates", json=BODY))[0] == 201
        body2 = {
            **BODY,
            "name": "bikv",
            "sampling": "session",
            "credentials_env": "CANARY_CANDIDATE_BIKV_KEY",
        }
        assert (await call(http, "POST", first.admin + "/candidates", json=body2))[0] == 201
        status, _ = await call(
            http,
            "PATCH",
            first.admin + "/candidates/int8",
            json={"sample_rate": 0.5, "verdict": {"min_pairs": 50}},
        )
        assert status == 200
        status, _ = await call(
            http,
            "POST",
            first.admin + "/candidates/bikv/promote",
            json={"force": True, "reason": "restart test"},
        )
        assert status == 200
    async with admin_server(db_url) as second, aiohttp.ClientSession() as http:
        assert second.registry.snapshot.live.name == "bikv"
        _, shown = await call(http, "GET", second.admin + "/candidates/int8")
        assert shown["sample_rate"] == 0.5 and shown["verdict"] == {"min_pairs": 50}
        _, listed = await call(http, "GET", second.admin + "/candidates")
        assert {c["name"]: c["role"] for c in listed["candidates"]} == {
            "int8": "candidate",
            LIVE.name: "retired",
        }


async def test_patch_fields(tmp_path: Path) -> None:
    """PATCH changes only the given fields, null clears a nullable one, the version goes up."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(
            http,
            "POST",
            srv.admin + "/candidates",
            json={**BODY, "model": "llama-int8", "price_per_hour_usd": 2.5},
        )
        url = srv.admin + "/candidates/int8"
        status, body = await call(http, "PATCH", url, json={"model": None, "concurrency": 9})
        assert status == 200
        assert body["model"] is None and body["concurrency"] == 9
        assert body["price_per_hour_usd"] == 2.5 and body["kind"] == "quantized"
        assert body["version"] == 2
        status, same = await call(http, "PATCH", url, json={})
        assert status == 200 and same["version"] == 2  # nothing to change, nothing written
        _, paused = await call(http, "PATCH", url, json={"state": "paused"})
        _, active = await call(http, "PATCH", url, json={"state": "active"})
        assert (paused["state"], active["state"]) == ("paused", "active")
        _, retired = await call(http, "PATCH", url, json={"role": "retired"})
        assert retired["role"] == "retired"


async def test_delete(tmp_path: Path) -> None:
    """DELETE answers 204 with no body, then the name is unknown."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json=BODY)
        assert await call(http, "DELETE", srv.admin + "/candidates/int8") == (204, None)
        status, body = await call(http, "GET", srv.admin + "/candidates/int8")
        assert status == 404 and body["error"]["type"] == "not_found"


async def test_status(tmp_path: Path) -> None:
    """`/status` shows the live endpoint, candidates with counters, the writer and last change."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json=BODY)
        srv.counters["int8"] = {"sampled": 3, "dropped_overflow": 1, "sent": 2}
        status, body = await call(http, "GET", srv.admin + "/status")
        assert status == 200
        assert body["live"]["name"] == LIVE.name
        assert body["candidates"][0]["counters"]["dropped_overflow"] == 1
        assert body["writer"]["queue_depth"] == 3
        assert body["last_promotion"] is None
        await call(http, "POST", srv.admin + "/candidates/int8/promote", json={"force": True})
        _, body = await call(http, "GET", srv.admin + "/status")
        assert body["live"]["name"] == "int8"
        assert body["last_promotion"]["to_endpoint"] == "int8"
        assert body["last_promotion"]["actor"] == "ci"


async def test_grader_round_trip(tmp_path: Path) -> None:
    """A candidate registered with a grader keeps it (defaults filled in) through storage and a
    reload, the registry snapshot carries it, and PATCH `grader: null` removes it."""
    grader = {
        "url": "http://127.0.0.1:9002",
        "model": "judge-7b",
        "price_per_mtok": 0.2,
        "credentials_env": "CANARY_CANDIDATE_JUDGE_KEY",
    }
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        body = {"name": "upgrade", "url": "http://127.0.0.1:9001/", "grader": grader}
        status, created = await call(http, "POST", srv.admin + "/candidates", json=body)
        assert status == 201, created
        assert created["grader"] == {
            **grader,
            "rate": 1.0,
            "swap_rate": 0.25,
            "max_per_minute": 60,
            "daily_token_budget": 2_000_000,
            "prompt": None,
            "label_rate": 0.0,
        }
        status, got = await call(http, "GET", srv.admin + "/candidates/upgrade")
        assert status == 200 and got["grader"] == created["grader"]
        (snap,) = srv.registry.snapshot.candidates
        assert snap.grader is not None and snap.grader.model == "judge-7b"
        url = srv.admin + "/candidates/upgrade"
        status, patched = await call(http, "PATCH", url, json={"grader": None})
        assert status == 200 and patched["grader"] is None
        status, got = await call(http, "GET", srv.admin + "/candidates/upgrade")
        assert got["grader"] is None
