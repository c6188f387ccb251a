"""Configuration: sources, precedence and the messages a bad setting produces."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import msgspec
import pytest

from domain.endpoint import GraderSpec
from domain.errors import ConfigError
from gateway.config.load import load_config, parse_admin_tokens, settings_variables
from gateway.config.names import FLAT_KEYS
from gateway.config.reference import reference
from gateway.config.sections import (
    SECTIONS,
    AdminConfig,
    CandidateConfig,
    GatewayConfig,
    split_host_port,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "gateway.example.toml"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return str(path)


def test_example_config_documents_every_key() -> None:
    """Every setting appears (set or commented) in its own table of the example file, every
    candidate setting under the commented `[[candidates]]` table, and every grader setting under
    its `[candidates.grader]` table."""
    text = EXAMPLE.read_text()
    tables = re.split(r"^(#? ?\[+[\w.]+\]+)", text, flags=re.M)
    keys_in: dict[str, set[str]] = {}
    for header, block in zip(tables[1::2], tables[2::2], strict=True):
        name = header.strip("# []")
        keys_in.setdefault(name, set()).update(re.findall(r"^#? ?(\w+) =", block, re.M))
    missing = [
        f"{section}.{f.name}"
        for section, cls in SECTIONS.items()
        for f in msgspec.structs.fields(cls)
        if f.name not in keys_in.get(section, set())
    ]
    missing += [
        f"candidates.{f.name}"
        for f in msgspec.structs.fields(CandidateConfig)
        if f.name not in keys_in.get("candidates", set()) | {"verdict", "grader"}
    ]
    missing += [
        f"candidates.grader.{f.name}"
        for f in msgspec.structs.fields(GraderSpec)
        if f.name not in keys_in.get("candidates.grader", set())
    ]
    assert missing == []
    assert {"verdict", "candidates", "candidates.verdict", "candidates.grader"} <= set(keys_in)


def test_example_config_loads_with_defaults() -> None:
    """The example file, as shipped, yields the built-in defaults except `admin.listen`: new
    configurations get the admin API on its own listener, existing ones keep the same port."""
    expected = GatewayConfig(admin=AdminConfig(listen="127.0.0.1:8081"))
    assert load_config(str(EXAMPLE), environ={}) == expected


def test_sectioned_file_env_and_flags(tmp_path: Path) -> None:
    """Section tables set their keys; CANARY_<SECTION>_<KEY> overrides the file and a dotted
    flag override beats both."""
    path = _write(
        tmp_path,
        "[server]\nworkers = 2\n[reports]\nmax_pairs = 7\nenabled = false\n"
        "[limits]\nmax_body_bytes = 10\n",
    )
    env = {"CANARY_REPORTS_MAX_PAIRS": "8", "CANARY_SERVER_WORKERS": "3"}
    cfg = load_config(path, overrides={"server.workers": 5}, environ=env)
    assert (cfg.server.workers, cfg.reports.max_pairs, cfg.reports.enabled) == (5, 8, False)
    assert cfg.limits.max_body_bytes == 10


def test_flat_key_of_before_the_sections_is_mapped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flat key at the top of a file still sets its sectioned place, with a deprecation line
    naming the new place; the same key given both ways is refused naming both."""
    path = _write(tmp_path, "report_max_pairs = 123\ncapture = false\nadmin_listen = '[::1]:9'\n")
    with caplog.at_level(logging.WARNING, logger="gateway.config.load"):
        cfg = load_config(path, environ={})
    assert cfg.reports.max_pairs == 123 and cfg.admin.listen == "[::1]:9"
    assert "'report_max_pairs' -> [reports] max_pairs" in caplog.text
    both = _write(tmp_path, "report_max_pairs = 1\n[reports]\nmax_pairs = 2\n")
    with pytest.raises(ConfigError, match=r"'reports.max_pairs' set twice .*'report_max_pairs'"):
        load_config(both, environ={})


# Sections declared after the flat names were retired: they never had one.
SECTIONS_WITHOUT_FLAT_NAMES = frozenset({"rollout"})


def test_every_flat_name_maps_onto_one_declared_field() -> None:
    """The table of flat names covers every field of the sections that had flat names once, and
    each target exists."""
    declared = {
        f"{s}.{f.name}"
        for s, c in SECTIONS.items()
        if s not in SECTIONS_WITHOUT_FLAT_NAMES
        for f in msgspec.structs.fields(c)
    }
    assert sorted(FLAT_KEYS.values()) == sorted(declared)


def test_environment_old_and_new_names() -> None:
    """CANARY_<OLD_KEY> and CANARY_<SECTION>_<KEY> both set the key, and both are settings
    variables (never a candidate's credential)."""
    old = load_config(
        None,
        environ={
            "CANARY_REPORT_MAX_PAIRS": "9",
            "CANARY_STORAGE_DB_URL": "sqlite+aiosqlite:///x.db",
        },
    )
    new = load_config(
        None,
        environ={
            "CANARY_REPORTS_MAX_PAIRS": "9",
            "CANARY_STORAGE_DB_URL": "sqlite+aiosqlite:///x.db",
        },
    )
    assert old == new
    assert old.reports.max_pairs == 9 and old.storage.db_url == "sqlite+aiosqlite:///x.db"
    names = settings_variables()
    assert {"CANARY_REPORT_MAX_PAIRS", "CANARY_REPORTS_MAX_PAIRS", "CANARY_CAPTURE"} <= names
    assert {"CANARY_CAPTURE_ENABLED", "CANARY_ADMIN_TOKEN", "CANARY_ADMIN_INSECURE"} <= names


def test_schema_shows_description_default_and_bounds() -> None:
    """The JSON schema of the declaration carries each field's description, default and bounds,
    so the reference is generated from it."""
    schema = msgspec.json.schema(GatewayConfig)
    for cls in SECTIONS.values():
        for name, prop in schema["$defs"][cls.__name__]["properties"].items():
            assert prop.get("description"), f"{cls.__name__}.{name}"
    reports = schema["$defs"]["ReportsConfig"]["properties"]["max_pairs"]
    assert (reports["default"], reports["exclusiveMinimum"]) == (10_000_000, 0)
    assert len(reference()) == sum(len(c.__struct_fields__) for c in SECTIONS.values()) + 2


def test_docs_configuration_is_generated_from_the_declaration() -> None:
    """docs/configuration.md is what docs/gen_config.py renders from the declaration now."""
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen.render(), "run `python docs/gen_config.py`"


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    """With the flat names of before the sections, flags override CANARY_* variables, which
    override the file."""
    path = _write(tmp_path, "workers = 2\nmax_body_bytes = 10\nlog_format = 'json'\n")
    env = {"CANARY_WORKERS": "3", "CANARY_MAX_BODY_BYTES": "20", "OTHER": "x"}
    cfg = load_config(path, overrides={"workers": 4, "listen": None}, environ=env)
    assert (cfg.server.workers, cfg.limits.max_body_bytes, cfg.server.log_format) == (4, 20, "json")
    assert cfg.server.listen == "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("wrkers = 2\n", "unknown key 'wrkers'"),
        ("[server]\nwrkers = 2\n", "unknown key 'server.wrkers'"),
        ("[srever]\nworkers = 2\n", "unknown key 'srever'"),
        ("[server]\nworkers = 'two'\n", "key 'server.workers': expected `int`, got `str`"),
        ("workers = 0\n", "key 'server.workers': expected `int` >= 1"),
        ("report_max_pairs = 0\n", "key 'reports.max_pairs': expected `int` >= 1"),
        ("[live]\nurl = 'ftp://x'\n", "key 'live.url': URL scheme must be http or https"),
        ("[server]\nlisten = 'localhost'\n", "key 'server.listen': expected HOST:PORT"),
        ("[storage]\ndb_url = 'mysql://x'\n", "key 'storage.db_url': must start with"),
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
        (
            "[rollout]\nstore_resume_after_s = 1.0\nstore_retry_max_s = 1.0\n",
            "key 'rollout.store_resume_after_s': 1 must exceed rollout.store_retry_max_s (1)",
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
    with pytest.raises(ConfigError, match=r"CANARY_WORKERS \(server.workers\)"):
        load_config(None, environ={"CANARY_WORKERS": "many"})
    with pytest.raises(ConfigError, match=r"CANARY_MIRROR_NICE \(mirror.nice\)"):
        load_config(None, environ={"CANARY_MIRROR_NICE": "40"})


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
    with pytest.raises(ConfigError, match="port must be an integer"):
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
