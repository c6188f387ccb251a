"""The gateway's user-facing start-up errors are the domain's (domain/errors.py), mapped at the
CLI and admin edges like every other, never a bare built-in."""

from __future__ import annotations

import pytest

from domain.errors import ConfigError, ProcessDidNotStart
from gateway.cli.errors import cli_errors
from gateway.config.load import config_from
from gateway.process.children import PlaneProcess
from gateway.server.app import start_gateway


async def test_a_gateway_without_a_live_endpoint_is_a_config_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """start_gateway with no live endpoint raises ConfigError naming `[live] url` (exit 2)."""
    with pytest.raises(ConfigError, match=r"\[live\] url") as caught:
        await start_gateway(config_from({"listen": "127.0.0.1:0"}))
    with cli_errors() as outcome:
        raise caught.value
    assert outcome.code == 2 and "[live] url" in capsys.readouterr().err


def _exit_at_once(*_args: object) -> None:
    """A child process's main that dies before it says it listens."""
    raise SystemExit(3)


class _DyingProcess(PlaneProcess):
    role = "dying"
    _target = staticmethod(_exit_at_once)


def test_a_child_that_does_not_start_is_a_domain_error() -> None:
    """A spawned child that dies before listening raises ProcessDidNotStart naming its role and
    exit code (exit 1 at the CLI), not a RuntimeError nor the pipe's EOFError."""
    proc = _DyingProcess(config_from({"live_url": "http://127.0.0.1:9"}))
    try:
        with pytest.raises(
            ProcessDidNotStart, match=r"the dying process did not start \(exit code -?\d+\)"
        ):
            proc.start(timeout_s=30.0)
    finally:
        proc.stop(1.0)
    assert ProcessDidNotStart.exit_code == 1
