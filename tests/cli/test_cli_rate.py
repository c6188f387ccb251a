"""`canary candidates add|update --target-rps`: the flag's help, exit 2 on a bad value before
any request is sent, and the target and realized rate in `show` and `list` against a real
gateway (real subprocesses, real admin API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_candidates import canary, fits
from tests.control.test_admin_harness import real_gateway


@pytest.mark.parametrize("action", ["add", "update"])
async def test_help_explains_the_flag(action: str) -> None:
    """`--help` names --target-rps, says sample_rate is the ceiling, and fits 80 columns."""
    code, out, _ = await canary("candidates", action, "--help")
    assert code == 0 and "--target-rps" in out and fits(out)
    assert "never above" in " ".join(out.split())


@pytest.mark.parametrize(
    ("value", "words"),
    [("0", "> 0"), ("-2", "> 0"), ("1e7", "<= 1e+06"), ("nan", "> 0"), ("fast", "copies per")],
)
async def test_bad_values_exit_2_before_any_request(value: str, words: str) -> None:
    """A bad --target-rps is refused by the parser: exit 2, the message names the option,
    and no gateway is needed (the admin URL points nowhere)."""
    code, _, err = await canary(
        "candidates", "add", "x", "http://127.0.0.1:9/", "--target-rps", value,
        url="http://127.0.0.1:9",
    )  # fmt: skip
    assert code == 2, err
    assert "--target-rps" in err and words in err and "Traceback" not in err


async def test_target_and_realized_rate_in_show_and_list(tmp_path: Path) -> None:
    """add --target-rps 20 --sample-rate 1, then list (RATE shows 20/s) and show (the target,
    its ceiling and the realized line); update --target-rps off goes back to the fixed rate;
    the API refusing a value is exit 2 too."""
    async with real_gateway(tmp_path, mirror_priority="normal") as gw:
        url = gw.url
        code, out, err = await canary(
            "candidates", "add", "rps", "http://127.0.0.1:9/", "--target-rps", "20",
            "--sample-rate", "1", url=url,
        )  # fmt: skip
        assert code == 0, err
        assert "20 copies/s, at most 1 of traffic" in out and fits(out)
        code, out, _ = await canary("candidates", "list", url=url)
        header, row = out.splitlines()[:2]
        assert header.split()[3:5] == ["RATE", "REALIZED"]
        assert row.split()[3] == "20/s" and fits(out)
        code, out, _ = await canary("candidates", "show", "rps", url=url)
        assert code == 0 and "realized" in out and fits(out), out
        code, out, _ = await canary("candidates", "show", "rps", "--format", "json", url=url)
        shown = json.loads(out)
        assert shown["target_rps"] == 20.0 and shown["rate"]["sample_rate"] == 1.0
        code, out, err = await canary("candidates", "update", "rps", "--target-rps", "off", url=url)
        assert code == 0, err
        assert "1 of traffic, by request" in out and "copies/s" not in out
        assert gw.registry.snapshot.candidates[0].target_rps is None
        code, _, err = await canary(
            "candidates", "update", "rps", "--sample-rate", "3", "--target-rps", "5", url=url
        )
        assert code == 2 and "sample_rate" in err
