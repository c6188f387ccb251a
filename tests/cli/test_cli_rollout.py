"""`canary rollout` as an operator runs it: real subprocesses against a running gateway's admin
API, text that fits 80 columns, JSON, and exit code 2 for every refusal and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_candidates import canary, fits
from tests.control.test_admin_harness import real_gateway


@pytest.mark.parametrize(
    "argv",
    [("rollout",), ("rollout", "start"), ("rollout", "status"), ("rollout", "abort")],
)
async def test_help(argv: tuple[str, ...]) -> None:
    """Each rollout command's --help explains it with an example and fits 80 columns."""
    code, out, _ = await canary(*argv, "--help")
    assert code == 0
    assert "example" in out and "canary rollout" in out.split("example", 1)[1]
    assert fits(out), out


async def test_operator_rollout(tmp_path: Path) -> None:
    """start (refused without a verdict, bad steps refused before any request), status in text
    and JSON, pause, resume, advance and abort against a running gateway."""
    async with real_gateway(tmp_path) as gw:
        url = gw.url
        assert (await canary("candidates", "add", "int8", "http://127.0.0.1:9/v1", url=url))[0] == 0
        code, out, _ = await canary("rollout", "status", url=url)
        assert code == 0 and "no rollout yet" in out

        code, _, err = await canary("rollout", "start", "int8", url=url)
        assert code == 2 and "'hold'" in err and "force" in err  # no pairs yet: hold
        for steps, why in (("5,1,100", "strictly increasing"), ("5,50", "not 100"), ("x", "x")):
            code, _, err = await canary("rollout", "start", "int8", "--steps", steps, url=url)
            assert code == 2 and why in err, err
        code, _, err = await canary("rollout", "start", "int8", "--force", url=url)
        assert code == 2 and "--reason" in err
        code, _, err = await canary("rollout", "start", "nope", "--force", "--reason", "r", url=url)
        assert code == 2 and "nope" in err

        code, out, err = await canary(
            "rollout", "start", "int8", "--steps", "10,50,100", "--min-step-s", "600",
            "--force", "--reason", "drill 12", url=url,
        )  # fmt: skip
        assert code == 0, err
        assert "int8" in out and "running, 10 % of new sessions" in out and "[10]" in out
        assert "drill 12" in out and fits(out), out
        code, _, err = await canary("rollout", "start", "int8", "--force", "--reason", "r", url=url)
        assert code == 2 and "complete or abort" in err
        code, _, err = await canary("promote", "int8", "--force", url=url)
        assert code == 2 and "abort" in err

        for action, expected in (
            ("pause", "paused, 10 %"),
            ("resume", "running, 10 %"),
            ("advance", "running, 50 %"),
        ):
            code, out, err = await canary("rollout", action, "--reason", f"r-{action}", url=url)
            assert code == 0 and expected in out, (out, err)
            assert f"r-{action}" in out and fits(out), out
            if action == "pause":  # a paused ramp is not advanced by hand: resume it first
                code, _, err = await canary("rollout", "advance", url=url)
                assert code == 2 and "resume it first" in err, err
        code, out, _ = await canary("rollout", "status", url=url)
        assert out.count("\n") >= 8 and fits(out), out
        header = next(line for line in out.splitlines() if line.startswith("AT"))
        assert header.split() == ["AT", "EVENT", "WEIGHT", "%", "BY", "REASON"]
        code, out, _ = await canary("rollout", "abort", "--format", "json", url=url)
        body = json.loads(out)
        assert (code, body["state"], body["weight"]) == (0, "aborted", 0.0)
        assert [e["kind"] for e in body["events"]] == [
            "start", "pause", "resume", "advance", "abort"
        ]  # fmt: skip
        assert body["events"][-1]["actor"] == "ci"
        code, _, err = await canary("rollout", "abort", url=url)
        assert code == 2 and "no rollout is running" in err
        code, out, _ = await canary("rollout", "status", "--format", "json", url=url)
        assert json.loads(out)["state"] == "aborted"
