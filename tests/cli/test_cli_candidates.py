"""`canary candidates|promote|rollback` as an operator runs them: real subprocesses against the
real gateway's admin API, readable 80-column output, JSON output, and exit codes 0 / 2 (the API
refused) / 1 (the API failed or is unreachable)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.control.test_admin_harness import TOKEN, real_gateway
from tests.fixtures_net import Served

REPO = Path(__file__).resolve().parents[2]
Result = tuple[int, str, str]


async def canary(*args: str, token: str | None = TOKEN, url: str | None = None) -> Result:
    """Run `python -m gateway.cli.main ARGS [--admin-url URL]`: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "CANARY_ADMIN_TOKEN"}
    env["COLUMNS"] = "80"
    if token is not None:
        env["CANARY_ADMIN_TOKEN"] = token
    argv = [*args, "--admin-url", url] if url else list(args)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        *argv,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def fits(text: str, width: int = 80) -> bool:
    return all(len(line) <= width for line in text.splitlines())


@pytest.mark.parametrize(
    "argv",
    [
        ("candidates",),
        ("candidates", "add"),
        ("candidates", "list"),
        ("candidates", "show"),
        ("candidates", "update"),
        ("promote",),
        ("rollback",),
    ],
)
async def test_help(argv: tuple[str, ...]) -> None:
    """Each command's --help explains it with an example and fits 80 columns."""
    code, out, _ = await canary(*argv, "--help")
    assert code == 0
    assert "example" in out and "canary " in out.split("example", 1)[1]
    assert fits(out), out


async def test_operator_session(tmp_path: Path) -> None:
    """add, list, show, update, pause, resume, promote, rollback and remove against a running
    gateway, with the exit code of every refusal."""
    async with real_gateway(tmp_path) as gw:
        url = gw.url
        code, out, err = await canary(
            "candidates", "add", "int8", "http://127.0.0.1:9/v1", "--kind", "quantized",
            "--sample-rate", "0.25", "--credentials-env", "CANARY_CANDIDATE_INT8", "--verdict",
            "min_pairs=50", url=url,
        )  # fmt: skip
        assert code == 0, err
        assert "int8" in out and "$CANARY_CANDIDATE_INT8" in out and "min_pairs=50" in out
        assert fits(out)

        code, _, err = await canary("candidates", "add", "int8", "http://h/", url=url)
        assert code == 2 and "already exists" in err
        code, _, err = await canary(
            "candidates", "add", "other", "http://h/", "--sample-rate", "2", url=url
        )
        assert code == 2 and "sample_rate" in err
        code, _, err = await canary(
            "candidates", "add", "other", "http://h/", "--verdict", "alpha", url=url
        )
        assert code == 2 and "KEY=NUMBER" in err  # refused by argparse, before any request

        long_url = "http://candidate-with-a-very-long-host-name.inference.internal:8000/v1/x"
        await canary("candidates", "add", "bikv-long-name", long_url, url=url)
        code, out, _ = await canary("candidates", "list", url=url)
        assert code == 0
        assert out.splitlines()[0].split() == [
            "NAME", "ROLE", "STATE", "RATE", "REALIZED", "SAMPLING", "KIND", "URL",
        ]  # fmt: skip
        assert "int8" in out and "quantized" in out and "0.25" in out
        assert fits(out), out
        code, out, _ = await canary("candidates", "list", "--format", "json", url=url)
        listed = json.loads(out)
        assert {c["name"] for c in listed["candidates"]} == {"int8", "bikv-long-name"}

        code, out, _ = await canary("candidates", "show", "int8", url=url)
        assert code == 0
        for word in ("counters", "sampled", "dropped_overflow", "pending", "buffer fill"):
            assert word in out
        assert fits(out), out
        code, out, _ = await canary("candidates", "show", "int8", "--format", "json", url=url)
        assert json.loads(out)["counters"]["sampled"] == 0

        code, out, _ = await canary(
            "candidates", "update", "int8", "--concurrency", "8", "--no-forward-auth", url=url
        )
        assert code == 0 and "8" in out
        assert (await canary("candidates", "pause", "int8", url=url))[1].strip() == "int8: paused"
        assert (await canary("candidates", "resume", "int8", url=url))[1].strip() == "int8: active"
        assert gw.registry.snapshot.candidates[0].state == "active"

        code, _, err = await canary("promote", "int8", url=url)
        assert code == 2 and "'hold'" in err and "force" in err  # no pairs yet: hold
        code, out, err = await canary(
            "promote", "int8", "--force", "--reason", "incident 4711", url=url
        )
        assert code == 0, err
        assert "promoted int8" in out and "(forced)" in out and "incident 4711" in out
        assert gw.live.endpoint.name == "int8"  # the proxy already sends traffic there
        code, out, _ = await canary("rollback", "--format", "json", url=url)
        assert code == 0 and json.loads(out)["promotion"]["to_endpoint"] == "live"
        code, _, err = await canary("rollback", url=url)
        assert code == 2 and "nothing to roll back" in err

        code, _, err = await canary("candidates", "remove", "live", url=url)
        assert code == 2 and "live endpoint" in err
        assert (await canary("candidates", "remove", "int8", url=url))[0] == 0
        code, _, err = await canary("candidates", "show", "int8", url=url)
        assert code == 2 and "no endpoint named 'int8'" in err


async def test_auth_errors(tmp_path: Path) -> None:
    """Without a token the CLI says which variable to set; a wrong token is refused; both 2."""
    async with real_gateway(tmp_path) as gw:
        code, _, err = await canary("candidates", "list", token=None, url=gw.url)
        assert code == 2 and "CANARY_ADMIN_TOKEN" in err
        code, _, err = await canary("candidates", "list", token="wrong", url=gw.url)
        assert code == 2 and "invalid bearer token" in err
        code, _, _ = await canary("candidates", "list", token=f"ops:x,ci:{TOKEN}", url=gw.url)
        assert code == 2  # the first `label:token` pair is the one the CLI sends
        code, _, _ = await canary("candidates", "list", token=f"ci:{TOKEN}", url=gw.url)
        assert code == 0


async def test_unreachable_and_server_errors(
    serve: Callable[[web.Application], Awaitable[Served]],
) -> None:
    """Connection refused and 5xx answers exit 1 with a clear message; a bad --admin-url is 2."""
    probe = await serve(web.Application())
    closed = probe.url
    await probe.close()  # nothing listens there any more
    code, out, err = await canary("candidates", "list", url=closed)
    assert code == 1 and out == ""
    assert f"cannot reach the admin API at {closed}" in err

    async def broken(request: web.Request) -> web.Response:
        body = {"error": {"message": "storage is unavailable", "type": "x", "code": 503}}
        return web.json_response(body, status=503)

    async def proxy_error(request: web.Request) -> web.Response:
        return web.Response(status=502, text="Bad Gateway")

    app = web.Application()
    app.router.add_get("/admin/candidates", broken)
    app.router.add_post("/admin/rollback", proxy_error)
    server = await serve(app)
    code, _, err = await canary("candidates", "list", url=server.url)
    assert code == 1 and "storage is unavailable" in err
    code, _, err = await canary("rollback", url=server.url)
    assert code == 1 and "HTTP 502: Bad Gateway" in err
    code, _, err = await canary("candidates", "list", url="gateway:8080")
    assert code == 2 and "--admin-url" in err
