"""Configuration: sources, precedence and the messages a bad setting produces."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from domain.errors import ConfigError
from gateway.config import (
    CandidateConfig,
    GatewayConfig,
    load_config,
    parse_admin_tokens,
    split_host_port,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "gateway.example.toml"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return str(path)


def test_example_config_documents_every_key() -> None:
    """Every top-level and candidate setting appears (set or commented) in the example file."""
    text = EXAMPLE.read_text()
    keys = [f.name for f in msgspec.structs.fields(GatewayConfig)]
    keys += [f.name for f in msgspec.structs.fields(CandidateConfig)]
    documented = re.compile(r"^#? ?(\w+) =|^#? ?\[+(?:candidates\.)?(\w+)\]+", re.M)
    present = {a or b for a, b in documented.findall(text)}
    missing = [k for k in keys if k not in present]
    assert missing == []


def test_example_config_loads_with_defaults() -> None:
    """The example file, as shipped, yields the built-in defaults except `admin_listen`: new
    configurations get the admin API on its own listener, existing ones keep the same port."""
    assert load_config(str(EXAMPLE), environ={}) == GatewayConfig(admin_listen="127.0.0.1:8081")


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    """Flags override CANARY_* variables, which override the file."""
    path = _write(tmp_path, "workers = 2\nmax_body_bytes = 10\nlog_format = 'json'\n")
    env = {"CANARY_WORKERS": "3", "CANARY_MAX_BODY_BYTES": "20", "OTHER": "x"}
    cfg = load_config(path, overrides={"workers": 4, "listen": None}, environ=env)
    assert (cfg.workers, cfg.max_body_bytes, cfg.log_format) == (4, 20, "json")
    assert cfg.listen == "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("wrkers = 2\n", "unknown key 'wrkers'"),
        ("workers = 'two'\n", "key 'workers': expected `int`, got `str`"),
        ("workers = 0\n", "key 'workers': expected `int` >= 1"),
        ("live_url = 'ftp://x'\n", "key 'live_url': URL scheme must be http or https"),
        ("listen = 'localhost'\n", "key 'listen': expected HOST:PORT"),
        ("db_url = 'mysql://x'\n", "key 'db_url': must start with"),
        ("[[candidates]]\nname = 'Bad Name'\nurl = 'http://x'\n", "key 'candidates[0].name'"),
        ("[[candidates]]\nname = 'a'\nurl = 'http://x'\nsample_rate = 2\n", "sample_rate"),
        (
            "[[candidates]]\nname = 'a'\nurl = 'http://x'\ntarget_rps = 0\n",
            "key 'candidates[0].target_rps': expected `float` > 0.0",
        ),
        (
            "[[candidates]]\nname = 'a'\nurl = 'http://x'\ntarget_rps = nan\n",
            "key 'candidates[0].target_rps'",
        ),
        (
            "[[candidates]]\nname = 'a'\nurl = 'http://x'\napi_key = 's'\n",
            "'candidates[0].api_key'",
        ),
        (
            "[[candidates]]\nname='a'\nurl='http://x'\n[[candidates]]\nname='a'\nurl='http://y'\n",
            "duplicate endpoint name 'a'",
        ),
        ("workers = \n", "not valid TOML"),
    ],
)
def test_bad_file_names_file_key_and_reason(tmp_path: Path, text: str, expected: str) -> None:
    """A bad setting in a file produces one message naming the file, the key and the reason."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert path in str(info.value)
    assert expected in str(info.value)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing config file is reported with its path, not as a traceback."""
    with pytest.raises(ConfigError, match=r"gone\.toml: cannot read"):
        load_config(str(tmp_path / "gone.toml"), environ={})


def test_bad_environment_variable_names_the_variable() -> None:
    """A CANARY_* variable of the wrong type is reported by its variable name."""
    with pytest.raises(ConfigError, match="CANARY_WORKERS"):
        load_config(None, environ={"CANARY_WORKERS": "many"})


def test_admin_tokens_parse_labels() -> None:
    """CANARY_ADMIN_TOKEN accepts a bare token or label:token pairs."""
    assert parse_admin_tokens("abc") == {"abc": "token1"}
    assert parse_admin_tokens("ops:a, ci:b") == {"a": "ops", "b": "ci"}
    assert parse_admin_tokens(None) == {}
    with pytest.raises(ConfigError):
        parse_admin_tokens("ops:")


def test_split_host_port_handles_ipv6() -> None:
    """Listener addresses parse for IPv4, names and bracketed IPv6."""
    assert split_host_port("[::1]:9000") == ("::1", 9000)
    assert split_host_port("0.0.0.0:0") == ("0.0.0.0", 0)
    with pytest.raises(ValueError):
        split_host_port("host:http")


def test_candidate_target_rps_from_a_file(tmp_path: Path) -> None:
    """`target_rps` in a `[[candidates]]` table is the candidate's target; absent, none."""
    path = _write(
        tmp_path,
        "[[candidates]]\nname = 'a'\nurl = 'http://x'\ntarget_rps = 12.5\nsample_rate = 1.0\n"
        "[[candidates]]\nname = 'b'\nurl = 'http://y'\n",
    )
    cfg = load_config(path, environ={})
    assert [c.target_rps for c in cfg.candidates] == [12.5, None]
    assert cfg.candidates[0].to_endpoint().target_rps == 12.5
