"""Regression tests of what `bench/fuzz_edges.py` found (schemathesis over the admin API with
every check; hypothesis over the proxy's raw request bytes), each against a real gateway."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from gateway.config.sections import CredentialsConfig
from gateway.control.admin.openapi import openapi_document
from tests.control.test_admin_harness import call, real_gateway


async def test_integral_float_is_an_integer(tmp_path: Path) -> None:
    """`"buffer_max_items": 12437.0` is the integer JSON Schema says it is (201, stored as
    12437); a fraction is still a 422 naming the field (schemathesis: ST202)."""
    async with real_gateway(tmp_path) as gw, aiohttp.ClientSession() as http:
        admin = gw.gateway.admin_url
        body = {"name": "c1", "url": "http://127.0.0.1:9/", "buffer_max_items": 12437.0}
        status, view = await call(http, "POST", admin + "/candidates", json=body)
        assert status == 201 and view["buffer_max_items"] == 12437
        body = {"name": "c2", "url": "http://127.0.0.1:9/", "buffer_max_items": 12437.5}
        status, err = await call(http, "POST", admin + "/candidates", json=body)
        assert status == 422 and err["error"]["field"] == "buffer_max_items"
        status, _ = await call(http, "PATCH", admin + "/candidates/c1", json={"concurrency": 3.0})
        assert status == 200


async def test_document_states_the_credential_policy(tmp_path: Path) -> None:
    """The served document's `credentials_env` admits exactly the names the handler accepts
    under the gateway's policy: the prefix, the allow-list, never a setting of the gateway
    (schemathesis: a schema-valid name was refused with 422)."""
    async with (
        real_gateway(tmp_path, candidate_credentials_allow=["OPENAI_KEY"]) as gw,
        aiohttp.ClientSession() as http,
    ):
        admin = gw.gateway.admin_url
        status, doc = await call(http, "GET", admin + "/openapi.json")
        assert status == 200
        text = doc["components"]["schemas"]["CandidateCreate"]["properties"]["credentials_env"]
        schema = next(b for b in text["anyOf"] if b.get("type") == "string")
        pattern, refused = re.compile(schema["pattern"]), set(schema["not"]["enum"])
        names = ["CANARY_CANDIDATE_A", "OPENAI_KEY", "AWS_SECRET_ACCESS_KEY", "CANARY_ADMIN_TOKEN",
                 "CANARY_CANDIDATE_CREDENTIALS_ALLOW", "CANARY_CANDIDATE_"]  # fmt: skip
        for i, name in enumerate(names):
            body = {"name": f"n{i}", "url": "http://127.0.0.1:9/", "credentials_env": name}
            status, _ = await call(http, "POST", admin + "/candidates", json=body)
            documented = bool(pattern.match(name)) and name not in refused
            assert (status == 201) == documented, (name, status)


def test_verdict_overrides_document_whole_numbers() -> None:
    """A verdict setting that is a count is documented as an integer (schemathesis: `1.5` for
    `min_metric_pairs` was schema-valid), and no unknown setting is admitted."""
    doc = openapi_document(CredentialsConfig())
    verdict = doc["components"]["schemas"]["CandidatePatch"]["properties"]["verdict"]
    assert verdict["properties"]["min_metric_pairs"] == {"type": "integer"}
    assert verdict["properties"]["alpha"] == {"type": "number"}
    assert verdict["additionalProperties"] is False
