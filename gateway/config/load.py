"""Reading the settings, validated once at start-up: the only module that reads files or
environment variables for settings.

Sources, lowest to highest precedence: the defaults declared in gateway.config.sections, a TOML
file (`--config`), environment variables (`CANARY_<SECTION>_<KEY>`, e.g.
`CANARY_REPORTS_MAX_PAIRS`, or the flat name of before the sections, e.g.
`CANARY_REPORT_MAX_PAIRS`), and command-line flags. A flat key of before the sections in a file
(`report_max_pairs = ...`) still works: it is mapped onto its section and logged once as
deprecated. A bad setting raises `ConfigError` whose message names the source, the key (dotted:
'reports.max_pairs') and the reason.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from domain.endpoint import (
    NAME_PATTERN,
    env_name_refusal,
)
from domain.errors import ConfigError
from gateway.config.names import ENV_PREFIX, ENV_VARIABLES, FLAT_KEYS
from gateway.config.sections import (
    SECTIONS,
    AdminConfig,
    CredentialsConfig,
    GatewayConfig,
    ServerConfig,
    split_host_port,
)
from gateway.config.tokenizer import check_token_counter

log = logging.getLogger(__name__)


_WARNED: set[str] = set()


_NAME_RE = re.compile(NAME_PATTERN)


def _field_type(dotted: str) -> Any:
    section, _, key = dotted.partition(".")
    return {f.name: f.type for f in msgspec.structs.fields(SECTIONS[section])}[key]


def check_http_url(value: str) -> str | None:
    """Return None when `value` is an absolute http(s) URL with a host, else the reason."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"URL scheme must be http or https, got {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "URL has no host"
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        # Paths are appended to the base URL: `…/base?x=1` + `/v1/chat/completions` would send
        # every request to `/base?x=1…`.
        return "URL must not have a query (?…) or fragment (#…): request paths are appended to it"
    return None


def _format_validation(source: str, exc: msgspec.ValidationError) -> str:
    text = str(exc)
    msg, _, path = text.partition(" - at `")
    path = path.rstrip("`")
    unknown = re.match(r"Object contains unknown field `(.+)`", msg)
    if unknown:
        key = (path[2:] + "." if path.startswith("$.") else "") + unknown.group(1)
        return f"{source}: unknown key {key!r}"
    key = path[2:] if path.startswith("$.") else path or "(top level)"
    return f"{source}: key {key!r}: {msg[0].lower() + msg[1:] if msg else 'invalid value'}"


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    data.setdefault(section, {})[key] = value


def _sectioned(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The file's tables as they are, its flat keys of before the sections moved to their place."""
    data: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS and isinstance(value, dict):
            data[key] = dict(value)
        elif key in FLAT_KEYS:
            flat[key] = value
        else:
            data[key] = value
    moved: list[str] = []
    for old, value in flat.items():
        dotted = FLAT_KEYS[old]
        section, _, key = dotted.partition(".")
        if key in data.get(section, {}):
            raise ConfigError(f"{source}: key {dotted!r} set twice (also as flat {old!r})")
        _put(data, dotted, value)
        if old not in _WARNED:
            _WARNED.add(old)
            moved.append(f"{old!r} -> [{section}] {key}")
    if moved:  # once per key and process: workers and children load the same file again
        log.warning("%s: flat keys are deprecated, move them: %s", source, ", ".join(moved))
    return data


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in environ.items():
        dotted = ENV_VARIABLES.get(name)
        if dotted is None:
            continue  # other CANARY_* variables (credentials, test knobs) are not settings
        try:
            _put(out, dotted, msgspec.convert(value, _field_type(dotted), strict=False))
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"environment variable {name} ({dotted}): {str(exc).split(' - at')[0].lower()}"
            ) from exc
    return out


def _merge(data: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and key in SECTIONS:
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value


def load_config(
    path: str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Build the config from defaults, the TOML file, CANARY_* variables and flag overrides.

    `overrides` keys are dotted (`"reports.max_pairs"`) or flat names of before the sections
    (`"report_max_pairs"`); a None value is no override.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = f"config file {path}"
        data = _sectioned(_read_toml(path), source)
        try:
            msgspec.convert(data, GatewayConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(_format_validation(source, exc)) from exc
    _merge(data, _env_overrides(os.environ if environ is None else environ))
    _merge(data, _nested(overrides or {}))
    cfg = _convert(data)
    _check_semantics(cfg, source)
    return cfg


def config_from(settings: Mapping[str, Any]) -> GatewayConfig:
    """A config from dotted or flat keys (None: the default), typed but without the start-up
    checks of `load_config` and without reading the environment: for tests and benchmarks."""
    return _convert(_nested(settings))


def _nested(settings: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None:
            continue
        dotted = FLAT_KEYS.get(key, key)
        if "." in dotted:
            _put(out, dotted, value)
        else:
            out[dotted] = value
    return out


def _convert(data: dict[str, Any]) -> GatewayConfig:
    try:
        return msgspec.convert(data, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(_format_validation("settings", exc)) from exc


def _check_semantics(cfg: GatewayConfig, source: str) -> None:
    try:
        split_host_port(cfg.server.listen)
    except ConfigError as exc:
        raise ConfigError(f"{source}: key 'server.listen': {exc}") from exc
    if cfg.live.url is not None and (reason := check_http_url(cfg.live.url)):
        raise ConfigError(f"{source}: key 'live.url': {reason}")
    if not cfg.storage.db_url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise ConfigError(
            f"{source}: key 'storage.db_url': must start with sqlite+aiosqlite:// or "
            f"postgresql+asyncpg://, got {cfg.storage.db_url!r}"
        )
    _check_credentials(cfg.credentials, source)
    _check_admin(cfg.admin, cfg.server, source)
    check_token_counter(cfg.mirror.token_counter, source)
    seen: set[str] = set()
    for i, cand in enumerate(cfg.candidates):
        where = f"{source}: key 'candidates[{i}]"
        if reason := check_http_url(cand.url):
            raise ConfigError(f"{where}.url': {reason}")
        if cand.credentials_env and (
            reason := credential_env_refusal(cfg.credentials, cand.credentials_env)
        ):
            raise ConfigError(f"{where}.credentials_env': {reason}")
        if (grader := cand.grader) is not None:
            if reason := check_http_url(grader.url):
                raise ConfigError(f"{where}.grader.url': {reason}")
            if grader.credentials_env and (
                reason := credential_env_refusal(cfg.credentials, grader.credentials_env)
            ):
                raise ConfigError(f"{where}.grader.credentials_env': {reason}")
        if cand.name in seen or cand.name == cfg.live.name:
            raise ConfigError(f"{where}.name': duplicate endpoint name {cand.name!r}")
        seen.add(cand.name)
    capture = cfg.capture
    if capture.enabled and not cfg.storage.store_text and not capture.despite_store_text_off:
        raise ConfigError(
            f"{source}: key 'capture.enabled': storage.store_text = false keeps request bodies "
            "out of storage; set capture.despite_store_text_off = true to capture them anyway"
        )
    rollout = cfg.rollout
    if rollout.store_resume_after_s <= rollout.store_retry_max_s:
        raise ConfigError(
            f"{source}: key 'rollout.store_resume_after_s': {rollout.store_resume_after_s:g} must "
            f"exceed rollout.store_retry_max_s ({rollout.store_retry_max_s:g}), so that a "
            "rollback decided while the store was gone is stored before a held worker resumes"
        )
    _check_verdict(cfg.verdict, f"{source}: key 'verdict'")
    for i, cand in enumerate(cfg.candidates):
        _check_verdict(cand.verdict, f"{source}: key 'candidates[{i}].verdict'")


_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


def settings_variables() -> frozenset[str]:
    """The environment variables that configure the gateway (never a candidate credential)."""
    return frozenset(ENV_VARIABLES)


def credential_env_refusal(credentials: CredentialsConfig, name: str) -> str | None:
    """Why a candidate's `credentials_env` may not name `name` (None: it may)."""
    if name in ENV_VARIABLES:
        return f"{name} configures the gateway itself and is never sent to a candidate"
    return env_name_refusal(
        name, credentials.candidate_prefix, frozenset(credentials.candidate_allow)
    )


def _check_credentials(cfg: CredentialsConfig, source: str) -> None:
    prefix = cfg.candidate_prefix
    if prefix and (not _ENV_NAME_RE.match(prefix) or prefix in (ENV_PREFIX, "_")):
        raise ConfigError(
            f"{source}: key 'credentials.candidate_prefix': must be an environment variable "
            f'prefix (A-Z, 0-9, _) narrower than {ENV_PREFIX!r}, or "" for the allow-list only,'
            f" got {prefix!r}"
        )
    for i, name in enumerate(cfg.candidate_allow):
        if not _ENV_NAME_RE.match(name) or name in ENV_VARIABLES:
            raise ConfigError(
                f"{source}: key 'credentials.candidate_allow[{i}]': {name!r} is not a variable "
                "a candidate may receive (A-Z, 0-9, _; not a CANARY_ setting)"
            )
    for i, header in enumerate(cfg.headers):
        if not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", header):
            raise ConfigError(
                f"{source}: key 'credentials.headers[{i}]': not a header name: {header!r}"
            )


def _check_admin(cfg: AdminConfig, server: ServerConfig, source: str) -> None:
    tokens = {**parse_admin_tokens(cfg.token), **parse_admin_tokens(cfg.labeller_token)}
    for label, token in ((lbl, tok) for tok, lbl in tokens.items()):
        if len(token) < cfg.token_min_length:
            raise ConfigError(
                f"{source}: key 'admin.token' (CANARY_ADMIN_TOKEN): the token labelled "
                f"{label!r} has {len(token)} characters, fewer than admin.token_min_length = "
                f"{cfg.token_min_length}; generate one with `openssl rand -hex 24`"
            )
    if cfg.listen is not None:
        try:
            split_host_port(cfg.listen)
        except ConfigError as exc:
            raise ConfigError(f"{source}: key 'admin.listen': {exc}") from exc
        if cfg.listen == server.listen and server.port != 0:
            raise ConfigError(
                f"{source}: key 'admin.listen': same address as 'server.listen'; leave it unset "
                "to serve the admin API on the proxy's port"
            )


def _check_verdict(overrides: Mapping[str, float | str], where: str) -> None:
    if not overrides:
        return
    from evaluators.judge.settings import VerdictSettings

    try:
        VerdictSettings().with_overrides(overrides)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def parse_admin_tokens(value: str | None) -> dict[str, str]:
    """`tok` or `label:tok,label2:tok2` -> {token: label}. Empty or None -> {}."""
    tokens: dict[str, str] = {}
    if not value:
        return tokens
    for i, item in enumerate(p.strip() for p in value.split(",")):
        if not item:
            continue
        label, sep, token = item.partition(":")
        if not sep:
            label, token = f"token{i + 1}", item
        if not token:
            raise ConfigError(f"CANARY_ADMIN_TOKEN: entry {i + 1} has an empty token")
        tokens[token] = label or f"token{i + 1}"
    return tokens


def is_valid_name(name: str) -> bool:
    return bool(_NAME_RE.match(name))
