"""No secret leaves the gateway (issue items 1, 5, 6): `credentials_env` names only candidate
variables, copies carry no client credential, database URLs are masked; against a complete
gateway on real sockets and a real SQLite file."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import aiohttp
import pytest

from domain.endpoint import Endpoint
from domain.errors import ConfigError
from gateway.config.load import credential_env_refusal, load_config, settings_variables
from gateway.config.sections import CredentialsConfig
from gateway.credentials import REFUSALS, candidate_credential
from storage import queries as q
from storage.engine import masked
from tests.control.test_admin_harness import admin_server, call, real_gateway
from tests.upstreams import raw_upstream

BODY = {"name": "bikv", "url": "http://127.0.0.1:9/v1"}
CHAT = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize(
    "name", ["CANARY_ADMIN_TOKEN", "AWS_SECRET_ACCESS_KEY", "CANARY_STORAGE_DB_URL"]
)
async def test_registration_refuses_other_variables(tmp_path: Path, name: str) -> None:
    """POST and PATCH naming a variable not meant for candidates are a 422 naming
    `credentials_env`; a `CANARY_CANDIDATE_` name is accepted."""
    async with (
        admin_server(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as srv,
        aiohttp.ClientSession() as http,
    ):
        url = srv.admin + "/candidates"
        status, body = await call(http, "POST", url, json={**BODY, "credentials_env": name})
        assert status == 422 and body["error"]["field"] == "credentials_env"
        ok = {**BODY, "credentials_env": "CANARY_CANDIDATE_BIKV"}
        assert (await call(http, "POST", url, json=ok))[0] == 201
        patch = {"credentials_env": name}
        status, body = await call(http, "PATCH", url + "/bikv", json=patch)
        assert status == 422 and body["error"]["field"] == "credentials_env"


def test_config_file_refuses_other_variables(tmp_path: Path) -> None:
    """A `[[candidates]]` table naming the admin token's variable stops the config load with
    the key; an allow-listed name is accepted; the allow-list cannot name a setting."""
    path = tmp_path / "gw.toml"
    cand = '[[candidates]]\nname = "c"\nurl = "http://127.0.0.1:9"\ncredentials_env = "{}"\n'
    path.write_text(cand.format("CANARY_ADMIN_TOKEN"))
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.credentials_env"):
        load_config(str(path), environ={})
    allow = '[credentials]\ncandidate_allow = ["{}"]\n'
    path.write_text(allow.format("VENDOR_KEY") + cand.format("VENDOR_KEY"))
    assert load_config(str(path), environ={}).candidates[0].credentials_env == "VENDOR_KEY"
    for setting in ("CANARY_ADMIN_TOKEN", "CANARY_REPORTS_MAX_PAIRS", "CANARY_REPORT_MAX_PAIRS"):
        path.write_text(allow.format(setting))
        with pytest.raises(ConfigError, match=r"credentials\.candidate_allow\[0\]"):
            load_config(str(path), environ={})


def test_every_settings_variable_is_refused_as_a_credential() -> None:
    """Every CANARY_ variable that configures the gateway, by its sectioned name or its flat
    name of before the sections, is refused as a candidate's credential even under a prefix
    that would admit it."""
    policy = CredentialsConfig(candidate_prefix="CANARY_ADMIN_")
    names = settings_variables()
    assert {"CANARY_ADMIN_TOKEN", "CANARY_ADMIN_TOKEN_MIN_LENGTH", "CANARY_STORAGE_DB_URL"} <= names
    assert {"CANARY_STORAGE_DB_URL", "CANARY_CAPTURE", "CANARY_CAPTURE_ENABLED"} <= names
    for name in names:
        assert credential_env_refusal(policy, name) is not None, name
    assert credential_env_refusal(policy, "CANARY_ADMIN_VENDOR_KEY") is None


async def test_copies_carry_no_client_or_foreign_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored candidate naming a forbidden variable gets no credential (logged once,
    counted), and no copy carries the client's `authorization`, `api-key`, `x-api-key`,
    `cookie` or `proxy-authorization`."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    heads: list[bytes] = []
    got = asyncio.Event()

    async def respond(head: bytes, writer: asyncio.StreamWriter) -> None:
        heads.append(head)
        got.set()
        body = b'{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}]}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async with raw_upstream(respond) as cand_url, real_gateway(tmp_path) as parts:
        ep = Endpoint(
            name="c", url=cand_url, sample_rate=1.0, credentials_env="AWS_SECRET_ACCESS_KEY"
        )
        await q.create_endpoint(parts.engine, ep)  # as an older gateway could have stored it
        await parts.registry.refresh()
        secrets = {
            "Authorization": "Bearer client-token",
            "api-key": "azure-key",
            "x-api-key": "gw-key",
            "Cookie": "session=abc",
            "Proxy-Authorization": "Basic cHJveHk=",
        }
        with caplog.at_level(logging.WARNING, logger="canary.credentials"):
            async with aiohttp.ClientSession() as http:
                # The host's mirror process learns of the stored endpoint at its next registry
                # poll: send until a copy has reached the candidate.
                for _ in range(100):
                    url = parts.url + "/v1/chat/completions"
                    async with http.post(url, json=CHAT, headers=secrets) as resp:
                        await resp.read()
                    if got.is_set():
                        break
                    await asyncio.sleep(0.2)
                await asyncio.wait_for(got.wait(), 20)
            # The lanes run in the host's mirror process: its refusal count reaches /metrics.
            refused = 0.0
            async with aiohttp.ClientSession() as http:
                for _ in range(100):
                    async with http.get(parts.url + "/metrics") as resp:
                        text = await resp.text()
                    found = re.search(
                        r"^canary_candidate_credentials_refused_total (\S+)$", text, re.M
                    )
                    refused = float(found.group(1)) if found else 0.0
                    if refused > 0:
                        break
                    await asyncio.sleep(0.1)
            assert refused > 0
    assert heads
    for head in heads:
        low = head.lower()
        for value in (*secrets.values(), "aws-secret-value"):
            assert value.lower().encode() not in low


def test_a_refused_credential_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Every refused look-up is counted; the first for an (endpoint, name) is logged, once."""
    config = CredentialsConfig()
    before = REFUSALS.count
    with caplog.at_level(logging.WARNING, logger="canary.credentials"):
        for _ in range(3):
            assert candidate_credential(config, "c2", "AWS_SECRET_ACCESS_KEY", {}) is None
    assert REFUSALS.count == before + 3
    refused = [r for r in caplog.records if "credential refused" in r.getMessage()]
    assert len(refused) == 1


def test_database_url_parameters_are_masked() -> None:
    """A password in the userinfo or in a `?password=` parameter never survives `masked`, the
    one function every message, the "listening" line and `/readyz` print URLs with."""
    url = "postgresql+asyncpg://u:pw1@127.0.0.1:5432/db?password=hunter22&ssl=disable"
    shown = masked(url)
    assert "hunter22" not in shown and "pw1" not in shown
    assert "ssl=disable" in shown and "redacted" in shown


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/base?x=1", "http://127.0.0.1:9/base#f"])
async def test_urls_with_query_or_fragment_are_refused(tmp_path: Path, url: str) -> None:
    """A candidate URL with a query or fragment is a 422 naming `url` at registration, and a
    live or candidate URL with one stops the config load naming the key."""
    async with (
        admin_server(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as srv,
        aiohttp.ClientSession() as http,
    ):
        status, body = await call(
            http, "POST", srv.admin + "/candidates", json={**BODY, "url": url}
        )
        assert status == 422 and body["error"]["field"] == "url"
    with pytest.raises(ConfigError, match=r"live\.url.*query"):
        load_config(overrides={"live_url": url}, environ={})
    path = tmp_path / "gw.toml"
    path.write_text(f'[[candidates]]\nname = "c"\nurl = "{url}"\n')
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.url"):
        load_config(str(path), environ={})
