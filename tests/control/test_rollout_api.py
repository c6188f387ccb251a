"""The rollout through the admin API on real storage: started only from a promote verdict (or
force with a reason), every refusal a 4xx naming its field or reason with nothing changed,
operators' transitions recorded as events, promote/rollback refused while a ramp is open, and
the state kept across a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from storage import queries
from tests.control.test_admin_harness import LIVE, admin_server, call
from tests.control.test_admin_report import setup, sqlite_url


async def _rollout(http: aiohttp.ClientSession, admin: str) -> Any:
    status, body = await call(http, "GET", admin + "/rollout")
    assert status == 200
    return body


async def test_start_needs_a_promote_verdict_or_force(tmp_path: Path) -> None:
    """A hold or reject verdict refuses the start (409 naming the verdict); force needs a
    reason (422 naming `reason`); a promote verdict starts at the first step."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await setup(srv, http)
        assert (await _rollout(http, srv.admin))["state"] == "none"
        for name in ("bad", "fresh"):
            status, body = await call(http, "POST", f"{srv.admin}/candidates/{name}/rollout")
            assert status == 409, body
            assert body["error"]["detail"]["reason"] == "verdict_not_promote"
            assert body["error"]["detail"]["verdict"] in ("reject", "hold")
        status, body = await call(
            http, "POST", f"{srv.admin}/candidates/fresh/rollout", json={"force": True}
        )
        assert (status, body["error"]["field"]) == (422, "reason")
        assert (await _rollout(http, srv.admin))["state"] == "none"

        status, body = await call(
            http, "POST", f"{srv.admin}/candidates/good/rollout", json={"min_step_s": 5}
        )
        assert status == 201, body
        assert (body["candidate"], body["state"], body["weight"]) == ("good", "running", 1.0)
        assert body["steps"] == [1.0, 5.0, 25.0, 50.0, 100.0] and body["min_step_s"] == 5.0
        start = body["events"][0]
        assert (start["kind"], start["actor"], start["evidence"]["verdict"]) == (
            "start",
            "ci",
            "promote",
        )


async def test_bad_input_and_conflicts_change_nothing(tmp_path: Path) -> None:
    """Bad steps are 422 naming `steps`, an unknown candidate 404, a paused candidate and a
    second rollout 409 with their reason codes; the stored rollout is unchanged by each."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        for name in ("a", "b"):
            body = {"name": name, "url": f"http://127.0.0.1:9/{name}"}
            assert (await call(http, "POST", srv.admin + "/candidates", json=body))[0] == 201
        url = srv.admin + "/candidates/a/rollout"
        forced = {"force": True, "reason": "drill"}
        for steps in ([5, 1, 100], [0, 50, 100], [10, 50, 120], [10, 50], []):
            status, body = await call(http, "POST", url, json={**forced, "steps": steps})
            assert (status, body["error"]["field"]) == (422, "steps"), (steps, body)
        status, body = await call(http, "POST", url, json={**forced, "min_step_s": -1})
        assert (status, body["error"]["field"]) == (422, "min_step_s")
        status, _ = await call(http, "POST", srv.admin + "/candidates/nope/rollout", json=forced)
        assert status == 404
        await call(http, "PATCH", srv.admin + "/candidates/b", json={"state": "paused"})
        status, body = await call(http, "POST", srv.admin + "/candidates/b/rollout", json=forced)
        assert (status, body["error"]["detail"]["reason"]) == (409, "candidate_paused")
        assert (await _rollout(http, srv.admin))["state"] == "none"
        for action in ("pause", "resume", "advance", "abort"):
            status, body = await call(http, "POST", f"{srv.admin}/rollout/{action}")
            assert (status, body["error"]["detail"]["reason"]) == (409, "no_open_rollout")

        status, first = await call(http, "POST", url, json={**forced, "steps": [10, 100]})
        assert status == 201
        await call(http, "PATCH", srv.admin + "/candidates/b", json={"state": "active"})
        status, body = await call(http, "POST", srv.admin + "/candidates/b/rollout", json=forced)
        assert (status, body["error"]["detail"]["reason"]) == (409, "rollout_open")
        status, body = await call(http, "POST", srv.admin + "/rollout/resume")
        assert (status, body["error"]["detail"]["reason"]) == (409, "not_paused")
        assert await _rollout(http, srv.admin) == first
        # A paused ramp is not advanced by hand: resume it first (docs/rollout.md says the same).
        assert (await call(http, "POST", srv.admin + "/rollout/pause"))[0] == 200
        status, body = await call(http, "POST", srv.admin + "/rollout/advance")
        assert (status, body["error"]["detail"]["reason"]) == (409, "not_running")
        assert "resume it first" in body["error"]["message"]
        paused = await _rollout(http, srv.admin)
        assert (paused["state"], paused["weight"]) == ("paused", first["weight"])


async def test_operators_round_trip_and_promotion_refused(tmp_path: Path) -> None:
    """Pause, resume, advance and abort each answer the rollout with its event; promote and
    rollback are refused (409 rollout_open) while it is open, and allowed after the abort."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json={"name": "a", "url": LIVE.url})
        forced = {"force": True, "reason": "drill", "steps": [10, 50, 100]}
        assert (await call(http, "POST", srv.admin + "/candidates/a/rollout", json=forced))[
            0
        ] == 201
        status, body = await call(
            http, "POST", srv.admin + "/candidates/a/promote", json={"force": True}
        )
        assert (status, body["error"]["detail"]["reason"]) == (409, "rollout_open")
        status, body = await call(http, "POST", srv.admin + "/rollback")
        assert (status, body["error"]["detail"]["reason"]) == (409, "rollout_open")
        assert (await queries.list_promotions(srv.engine, 5)) == []

        expected = [
            ("pause", "paused", 10.0),
            ("resume", "running", 10.0),
            ("advance", "running", 50.0),
            ("pause", "paused", 50.0),
            ("abort", "aborted", 0.0),
        ]
        for action, state, weight in expected:
            status, body = await call(
                http, "POST", f"{srv.admin}/rollout/{action}", json={"reason": f"r-{action}"}
            )
            assert status == 200, body
            assert (body["state"], body["weight"]) == (state, weight)
            assert (body["events"][-1]["kind"], body["events"][-1]["reason"]) == (
                action,
                f"r-{action}",
            )
        kinds = [e["kind"] for e in (await _rollout(http, srv.admin))["events"]]
        assert kinds == ["start", "pause", "resume", "advance", "pause", "abort"]
        status, _ = await call(
            http, "POST", srv.admin + "/candidates/a/promote", json={"force": True}
        )
        assert status == 200


async def test_restart_keeps_the_rollout(tmp_path: Path) -> None:
    """A gateway restarted on the same database answers the same rollout, state and weight."""
    url = sqlite_url(tmp_path)
    async with admin_server(url) as srv, aiohttp.ClientSession() as http:
        await call(http, "POST", srv.admin + "/candidates", json={"name": "a", "url": LIVE.url})
        forced = {"force": True, "reason": "drill", "steps": [10, 50, 100]}
        await call(http, "POST", srv.admin + "/candidates/a/rollout", json=forced)
        await call(http, "POST", srv.admin + "/rollout/advance")
        _, before = await call(http, "POST", srv.admin + "/rollout/pause")
    async with admin_server(url) as srv, aiohttp.ClientSession() as http:
        after = await _rollout(http, srv.admin)
    assert after == before and (after["state"], after["weight"]) == ("paused", 50.0)
