"""Typed configuration for the whole gateway, validated once at start-up.

Sources, lowest to highest precedence: defaults in the Structs below, a TOML file (`--config`),
`CANARY_<KEY>` environment variables (top-level keys only, e.g. `CANARY_MAX_BODY_BYTES`), and
command-line flags. This is the only module that reads files or environment variables for
settings; everything else receives a frozen `GatewayConfig`.

A bad setting raises `ConfigError` whose message names the source, the key and the reason.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from domain.endpoint import NAME_PATTERN, CandidateSpec, Endpoint, MiB
from domain.errors import ConfigError

_NAME_RE = re.compile(NAME_PATTERN)

PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Rate = Annotated[float, Meta(ge=0.0, le=1.0)]
Name = Annotated[str, Meta(pattern=NAME_PATTERN)]


# A `[[candidates]]` table is the same spec the admin API accepts: one type, one set of defaults.
CandidateConfig = CandidateSpec


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every gateway setting with its default. configs/gateway.example.toml documents each."""

    # --- listener and process model
    listen: str = "127.0.0.1:8080"
    workers: PosInt = 1
    log_format: Literal["json", "text"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    replica_name: str = ""  # label for this gateway in stored rows; default: hostname-pid

    # --- the live endpoint (None: start the built-in engine simulator as the live endpoint)
    live_url: str | None = None
    live_name: Name = "live"
    live_price_per_hour_usd: NonNegFloat | None = None
    live_gpus: PosInt = 1

    # --- proxy
    max_body_bytes: PosInt = 64 * MiB
    upstream_max_connections: NonNegInt = 1024  # 0 = unlimited
    upstream_keepalive_s: PosFloat = 60.0
    connect_timeout_s: PosFloat = 10.0
    # vLLM may queue a long prompt before its first byte; generous by default.
    ttfb_timeout_s: PosFloat = 600.0
    idle_timeout_s: PosFloat = 300.0  # longest gap between two chunks of one response
    total_timeout_s: NonNegFloat = 3600.0  # 0 = no total limit
    session_header: str = "X-Session-ID"

    # --- mirror
    mirror_memory_budget_bytes: PosInt = 256 * MiB
    mirror_shed_loop_lag_ms: PosFloat = 20.0
    # Share of one core the event-loop thread may use before new copies are shed (0 = never):
    # a saturated loop need not lag, and copies must only use spare CPU.
    mirror_shed_cpu_busy: Rate = 0.9
    dedup_window_s: NonNegFloat = 60.0
    drain_timeout_s: NonNegFloat = 10.0

    # --- storage
    db_url: str = "sqlite+aiosqlite:///./canary.db"
    store_text: bool = True
    store_text_max_chars: NonNegInt = 4096
    writer_batch_size: PosInt = 500
    writer_flush_interval_s: PosFloat = 0.5
    writer_queue_max: PosInt = 100_000
    registry_poll_interval_s: PosFloat = 2.0
    counters_flush_interval_s: PosFloat = 5.0

    # --- capture: request bodies of a sample of mirrored conversations, for `canary capacity`
    # Off by default: it stores request bodies. With store_text = false it stays off unless
    # capture_despite_store_text_off says otherwise.
    capture: bool = False
    capture_share: Rate = 0.1  # share of conversations captured (whole conversations)
    capture_candidates: list[Name] = msgspec.field(default_factory=list)  # empty: every one
    # Total bytes of bodies kept inside the retention age; beyond it new bodies are refused.
    capture_max_bytes: PosInt = 256 * MiB
    capture_max_body_bytes: PosInt = 1 * MiB  # one body larger than this is refused
    capture_retention_s: PosFloat = 7 * 86400.0  # older captures are deleted
    # Bodies waiting for the database; bounds the memory a slow database can cost.
    capture_queue_max: PosInt = 10_000
    # JSON fields replaced by "[redacted]" before storing (dotted paths, `*` for any key/item).
    capture_redact_fields: list[str] = msgspec.field(default_factory=lambda: ["user"])
    # Headers redacted besides Authorization and Proxy-Authorization (always redacted).
    capture_redact_headers: list[str] = msgspec.field(
        default_factory=lambda: ["cookie", "x-api-key", "api-key"]
    )
    capture_despite_store_text_off: bool = False

    # --- admin API
    admin_token: str | None = None  # `token` or comma-separated `label:token` pairs
    insecure_admin: bool = False

    # --- evaluation (overrides of evaluators.judge.settings.VerdictSettings, by field name)
    verdict: dict[str, float] = msgspec.field(default_factory=dict)

    # --- candidates declared in the file (seeded into the registry on first start)
    candidates: list[CandidateConfig] = msgspec.field(default_factory=list)

    @property
    def listen_host(self) -> str:
        return split_host_port(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_host_port(self.listen)[1]

    def live_endpoint(self, url: str) -> Endpoint:
        return Endpoint(
            name=self.live_name,
            url=url,
            role="live",
            kind="live",
            sample_rate=0.0,
            price_per_hour_usd=self.live_price_per_hour_usd,
            gpus=self.live_gpus,
        )


def split_host_port(value: str) -> tuple[str, int]:
    """Parse `HOST:PORT` (IPv6 as `[::1]:8080`); raises ValueError with the reason."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port!r}")
    return host, int(port)


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
    return None


_FIELDS = {f.name: f for f in msgspec.structs.fields(GatewayConfig)}
ENV_PREFIX = "CANARY_"


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


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        field = _FIELDS.get(name)
        if field is None or name in ("candidates", "verdict"):
            continue  # other CANARY_* variables (credentials, test knobs) are not settings
        try:
            out[name] = msgspec.convert(value, field.type, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"environment variable {key}: {str(exc).split(' - at')[0].lower()}"
            ) from exc
    return out


def load_config(
    path: str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Build the config from defaults, the TOML file, CANARY_* variables and flag overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = _read_toml(path)
        source = f"config file {path}"
        try:
            msgspec.convert(data, GatewayConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(_format_validation(source, exc)) from exc
    data.update(_env_overrides(os.environ if environ is None else environ))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        cfg = msgspec.convert(data, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(_format_validation("settings", exc)) from exc
    _check_semantics(cfg, source)
    return cfg


def _check_semantics(cfg: GatewayConfig, source: str) -> None:
    try:
        split_host_port(cfg.listen)
    except ValueError as exc:
        raise ConfigError(f"{source}: key 'listen': {exc}") from exc
    if cfg.live_url is not None and (reason := check_http_url(cfg.live_url)):
        raise ConfigError(f"{source}: key 'live_url': {reason}")
    if not cfg.db_url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise ConfigError(
            f"{source}: key 'db_url': must start with sqlite+aiosqlite:// or "
            f"postgresql+asyncpg://, got {cfg.db_url!r}"
        )
    seen: set[str] = set()
    for i, cand in enumerate(cfg.candidates):
        where = f"{source}: key 'candidates[{i}]"
        if reason := check_http_url(cand.url):
            raise ConfigError(f"{where}.url': {reason}")
        if cand.name in seen or cand.name == cfg.live_name:
            raise ConfigError(f"{where}.name': duplicate endpoint name {cand.name!r}")
        seen.add(cand.name)
    if cfg.capture and not cfg.store_text and not cfg.capture_despite_store_text_off:
        raise ConfigError(
            f"{source}: key 'capture': store_text = false keeps request bodies out of storage; "
            "set capture_despite_store_text_off = true to capture them anyway"
        )
    _check_verdict(cfg.verdict, f"{source}: key 'verdict'")
    for i, cand in enumerate(cfg.candidates):
        _check_verdict(cand.verdict, f"{source}: key 'candidates[{i}].verdict'")


def _check_verdict(overrides: dict[str, float], where: str) -> None:
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
