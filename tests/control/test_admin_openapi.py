"""The OpenAPI 3.1 document of the admin API: it covers every route, its schemas admit exactly
what the handlers accept, and schemathesis fuzzing the real gateway finds no 5xx and no
response that breaks the document."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import aiohttp
import pytest
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.endpoint import URL_PATTERN
from gateway.config.load import check_http_url
from gateway.config.sections import CandidateConfig, CredentialsConfig
from gateway.control.admin.openapi import openapi_document
from gateway.control.admin.schema import CandidateCreate
from gateway.control.admin.ui import is_public
from tests.control.test_admin_harness import TOKEN, admin_server, call, real_gateway

# Fuzzing budget per operation and phase: about 1,000 requests, 10-20 s.
MAX_EXAMPLES = 25

SCHEMATHESIS_TOML = """
# Known names, half of the time, so per-name operations reach their logic instead of 404.
[dictionaries.names]
values = ["int8", "prod", "live"]

[parameters]
"path.name" = { dictionary = "names", probability = 0.5 }

# The gate answers 412 (reject) and 425 (hold) to perfectly valid requests, by design.
[[operations]]
include-operation-id-regex = "^gateCandidate(Webhook)?$"
checks.positive_data_acceptance.expected-statuses = ["200", "404", "412", "425"]

# A rollout's steps must be strictly increasing and end at 100, and a forced start needs a
# reason: rules across values that JSON Schema cannot state either.
# Verdict overrides have cross-field rules (latency_delta <= latency_critical, ...) that JSON
# Schema cannot state, so a schema-valid body may be refused with 422; the rest of these
# schemas' fidelity is checked by test_url_pattern_admits_only_valid_urls and the 422 tests.
[[operations]]
include-operation-id-regex = "^(createCandidate|updateCandidate|startRollout)$"
checks.positive_data_acceptance.enabled = false
"""


async def test_document_covers_every_route(tmp_path: Path) -> None:
    """Every route of the sub-app is documented with its methods, auth and error responses,
    and schemathesis accepts the document as OpenAPI 3.1."""
    doc = openapi_document(CredentialsConfig())  # the credential policy of the server's settings
    assert doc["openapi"] == "3.1.0"
    async with admin_server(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as srv:
        sub = next(
            r for r in srv.served.app.router.resources() if hasattr(r, "_app")
        )._app  # the /admin sub-app
        routes = {
            (route.method.lower(), route.resource.canonical.removeprefix("/admin"))
            for route in sub.router.routes()
            if route.method != "HEAD" and not is_public(route.name)  # the page's files
        }
        async with aiohttp.ClientSession() as http:
            status, served = await call(http, "GET", srv.admin + "/openapi.json", headers={})
    assert status == 200 and served == doc
    documented = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert routes == documented
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path != "/openapi.json":
                assert {"401", "404"} <= set(op["responses"]), (method, path)
            for code, resp in op["responses"].items():
                if code.startswith(("4", "5")) and code not in ("412", "425"):  # gate: reports
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody")
    loaded = schemathesis.openapi.from_dict(doc)
    assert len(list(loaded.get_all_operations())) == len(documented)


def test_create_defaults_are_the_config_defaults() -> None:
    """A candidate registered through the API gets the defaults of a `[[candidates]]` table."""
    api = CandidateCreate(name="x", url="http://h/")
    file = CandidateConfig(name="x", url="http://h/")
    for field in CandidateConfig.__struct_fields__:
        assert getattr(api, field) == getattr(file, field), field


@settings(max_examples=300, deadline=None)
@given(st.from_regex(URL_PATTERN, fullmatch=True))
def test_url_pattern_admits_only_valid_urls(url: str) -> None:
    """Every URL the documented pattern admits passes the handler's own URL check."""
    assert check_http_url(url) is None


def test_url_pattern_refuses_credentials_and_bad_ports() -> None:
    """The pattern refuses what must never be stored or cannot work."""
    pattern = re.compile(URL_PATTERN)
    for url in (
        "http://user:pw@host/",
        "http://token@host/",
        "ftp://host/",
        "http://host:65536/",
        "http://[0]/",
        "http://host/\x00",
        "http:///path",
    ):
        assert not pattern.match(url), url
    for url in ("http://[::1]:8000/v1", "https://gpu-7.internal:8443", "http://10.0.0.5"):
        assert pattern.match(url), url


@pytest.mark.slow  # a fuzzer: ~45 s on two cores
async def test_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    """schemathesis (every check, all phases, bounded) against the real gateway on SQLite."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_TOML)
    async with real_gateway(tmp_path) as gw, aiohttp.ClientSession() as http:
        admin = gw.url + "/admin"
        body = {"name": "int8", "url": "http://127.0.0.1:9/"}
        assert (await call(http, "POST", admin + "/candidates", json=body))[0] == 201
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "st"),
            "--no-color",
            "--config-file",
            str(config),
            "run",
            admin + "/openapi.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--request-timeout",
            "20",
            cwd=tmp_path,  # its cache directory goes there, not into the repository
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report[-6000:]
    assert "passed" in report
