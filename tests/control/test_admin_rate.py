"""`target_rps` through the admin API: stored, changed and cleared; refused with 422 naming the
field on create and on patch; described by the OpenAPI document; and the candidate view (and
the list) report the realized rate the host's mirror process measured (real gateway, real
mirror process, real sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.control.admin.openapi import openapi_document
from tests.control.test_admin_errors import BODY, assert_error, sqlite_url
from tests.control.test_admin_harness import admin_server, auth, call, real_gateway


async def test_create_patch_and_clear(tmp_path: Path) -> None:
    """A target is stored and returned; PATCH changes it; `null` clears it; the list and the
    detail show it, the detail with `sample_rate` as its ceiling."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        status, body = await call(http, "POST", url, json={**BODY, "target_rps": 20})
        assert status == 201 and body["target_rps"] == 20.0
        status, body = await call(http, "PATCH", url + "/int8", json={"target_rps": 2.5})
        assert status == 200 and body["target_rps"] == 2.5
        status, body = await call(http, "GET", url + "/int8")
        assert body["rate"]["target_rps"] == 2.5 and body["rate"]["sample_rate"] == 0.1
        assert body["rate"]["effective_sample_rate"] is None  # no mirror process here
        status, listed = await call(http, "GET", url)
        assert listed["candidates"][0]["target_rps"] == 2.5
        status, body = await call(http, "PATCH", url + "/int8", json={"target_rps": None})
        assert status == 200 and body["target_rps"] is None
        assert srv.registry.snapshot.candidates[0].target_rps is None


@pytest.mark.parametrize(
    ("value", "words"),
    [(0, "> 0.0"), (-1, "> 0.0"), (1e7, "<= 1000000.0"), ("fast", "got `str`"), (True, "bool")],
)
async def test_patch_refuses_bad_targets(tmp_path: Path, value: Any, words: str) -> None:
    """A bad `target_rps` in a PATCH is 422 with `field` = target_rps; nothing changes."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        url = srv.admin + "/candidates"
        await call(http, "POST", url, json={**BODY, "target_rps": 20})
        status, body = await call(http, "PATCH", url + "/int8", json={"target_rps": value})
        assert status == 422, body
        assert_error(body, 422, "validation_error")
        assert body["error"]["field"] == "target_rps" and words in body["error"]["message"]
        assert "target_rps" in body["error"]["message"]
        assert srv.registry.snapshot.candidates[0].target_rps == 20.0


def test_openapi_describes_the_target_and_the_rate() -> None:
    """The document has `target_rps` (exclusive minimum 0) on create and patch, and the
    realized rate on the candidate view."""
    schemas = openapi_document()["components"]["schemas"]
    create = schemas["CandidateCreate"]["properties"]["target_rps"]
    assert any(o.get("exclusiveMinimum") == 0.0 for o in create["anyOf"])
    assert "target_rps" in schemas["CandidatePatch"]["properties"]
    rate = schemas["RateView"]["properties"]
    assert {"effective_sample_rate", "realized_copies_per_second", "sessions_cut"} <= set(rate)
    assert schemas["CandidateDetail"]["properties"]["rate"] == {
        "$ref": "#/components/schemas/RateView"
    }


async def test_realized_rate_through_a_real_gateway(tmp_path: Path) -> None:
    """A candidate with a target, traffic through the gateway: the detail's `rate` (and the
    list's `rates`) carry the mirror process's measured share, eligible rate and realized
    copies/s, and the share this worker applies is the host's."""
    async with (
        real_gateway(tmp_path, mirror_priority="normal") as gw,
        aiohttp.ClientSession() as http,
    ):
        admin = gw.url + "/admin/candidates"
        cand = {"name": "rps", "url": gw.live.endpoint.url, "target_rps": 5, "sample_rate": 1}
        assert (await call(http, "POST", admin, json=cand))[0] == 201
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        rate: dict[str, Any] = {}
        async with asyncio.timeout(60):  # until measured, and the worker applies the share
            while (
                rate.get("realized_copies_per_second") is None
                or rate["worker_sample_rate"] != rate["effective_sample_rate"]
            ):
                for _ in range(10):
                    async with http.post(gw.url + "/v1/chat/completions", json=chat) as r:
                        await r.read()
                rate = (await call(http, "GET", admin + "/rps"))[1]["rate"]
        assert rate["target_rps"] == 5.0 and rate["worker"] == gw.replica
        assert 0 < rate["effective_sample_rate"] <= 1.0
        assert rate["eligible_requests_per_second"] > 0
        listed = (await call(http, "GET", admin, headers=auth()))[1]
        assert listed["rates"]["rps"]["target_rps"] == 5.0
