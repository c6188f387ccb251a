"""Typed configuration for the whole gateway, validated once at start-up.

Settings come in sections, one per concern (`[server]`, `[live]`, `[upstream]`, `[limits]`,
`[credentials]`, `[mirror]`, `[reports]`, `[storage]`, `[capture]`, `[admin]`, `[verdict]`,
`[[candidates]]`); each plane receives the sections it uses, only the wiring (gateway/process,
gateway/cli) sees the whole `GatewayConfig`. Every field carries its description in its
declaration: `reference()` lists them and docs/configuration.md is generated from it.

Sources, lowest to highest precedence: defaults in the Structs below, a TOML file (`--config`),
environment variables (`CANARY_<SECTION>_<KEY>`, e.g. `CANARY_REPORTS_MAX_PAIRS`, or the flat
name of before the sections, e.g. `CANARY_REPORT_MAX_PAIRS`), and command-line flags. A flat
key of before the sections in a file (`report_max_pairs = ...`) still works: it is mapped onto
its section and logged once as deprecated. This is the only module that reads files or
environment variables for settings.

A bad setting raises `ConfigError` whose message names the source, the key (dotted:
'reports.max_pairs') and the reason.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from domain.endpoint import (
    NAME_PATTERN,
    CandidateSpec,
    Endpoint,
    Gpus,
    MiB,
    Name,
    Price,
    Rate,
    env_name_refusal,
)
from domain.errors import ConfigError

log = logging.getLogger(__name__)

# Headers that carry a client's credentials (`[credentials] headers` replaces the list):
# OpenAI's and vLLM's `Authorization`, Azure OpenAI's `api-key`, gateways' `x-api-key`, browser
# sessions' `Cookie`, and `Proxy-Authorization`. A copy goes to a URL an admin chose: none of
# them reaches it unless the candidate says `forward_auth`.
CREDENTIAL_HEADERS: Final = frozenset(
    ("authorization", "api-key", "x-api-key", "cookie", "proxy-authorization")
)


_NAME_RE = re.compile(NAME_PATTERN)

PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Nice = Annotated[int, Meta(ge=0, le=19)]
Priority = Literal["idle", "nice", "normal"]


def _d(text: str) -> Meta:
    return Meta(description=text)


# A `[[candidates]]` table is the same spec the admin API accepts: one type, one set of defaults.
CandidateConfig = CandidateSpec


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The listener, the process model, logs and shutdown."""

    listen: Annotated[str, _d("HOST:PORT the gateway listens on (IPv6 as [::1]:8080).")] = (
        "127.0.0.1:8080"
    )
    workers: Annotated[PosInt, _d("Processes sharing the port with SO_REUSEPORT.")] = 1
    log_format: Annotated[Literal["json", "text"], _d("Log line format.")] = "text"
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"], _d("Lowest level logged.")
    ] = "info"
    replica_name: Annotated[
        str, _d('Label for this gateway in stored rows; "" = hostname-pid.')
    ] = ""
    event_loop: Annotated[
        Literal["auto", "uvloop", "asyncio"],
        _d("Event loop of every process: uvloop when installed (auto), or asyncio's own."),
    ] = "auto"
    session_header: Annotated[
        str, _d("Header naming a conversation, for session sampling and capture.")
    ] = "X-Session-ID"
    drain_timeout_s: Annotated[
        NonNegFloat,
        _d(
            "On shutdown, time given to requests and copies in flight; copies left count as "
            "dropped."
        ),
    ] = 10.0

    @property
    def host(self) -> str:
        return split_host_port(self.listen)[0]

    @property
    def port(self) -> int:
        return split_host_port(self.listen)[1]


class LiveConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The live endpoint; each field is the live `Endpoint`'s field of the same name."""

    url: Annotated[
        str | None,
        _d(
            "The production vLLM / OpenAI-compatible endpoint; unset: the built-in engine "
            "simulator serves as live. Seeds the registry on first start only."
        ),
    ] = None
    name: Annotated[Name, _d("Name of the live endpoint in the registry and in reports.")] = "live"
    price_per_hour_usd: Annotated[
        Price | None, _d("$/hour per GPU of the live deployment, for cost comparison.")
    ] = None
    gpus: Annotated[Gpus, _d("GPUs of the live deployment.")] = 1

    def endpoint(self, url: str) -> Endpoint:
        return Endpoint(
            name=self.name,
            url=url,
            role="live",
            kind="live",
            sample_rate=0.0,
            price_per_hour_usd=self.price_per_hour_usd,
            gpus=self.gpus,
        )


class UpstreamConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Connections to the live endpoint and to candidates, and the proxy's timeouts."""

    max_connections: Annotated[
        NonNegInt, _d("Pooled keep-alive connections to the live endpoint; 0 = unlimited.")
    ] = 1024
    keepalive_s: Annotated[PosFloat, _d("Idle upstream connections are closed after this.")] = 60.0
    connect_timeout_s: Annotated[PosFloat, _d("TCP connect to an upstream; beyond: 502.")] = 10.0
    ttfb_timeout_s: Annotated[
        PosFloat,
        _d("Request sent -> first response byte (vLLM may queue a long prompt); beyond: 504."),
    ] = 600.0
    idle_timeout_s: Annotated[PosFloat, _d("Longest gap between two chunks of one response.")] = (
        300.0
    )
    total_timeout_s: Annotated[NonNegFloat, _d("Whole request; 0 = no total limit.")] = 3600.0


class LimitsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one client, and all clients together, may cost the proxy listener."""

    max_body_bytes: Annotated[PosInt, _d("Largest request body accepted; larger: 413.")] = 64 * MiB
    max_body_bytes_in_flight: Annotated[
        PosInt,
        _d(
            "Bytes of request bodies held by requests in flight, all together (a few slow "
            "uploads must not hold gigabytes); beyond: 503 gateway_overloaded."
        ),
    ] = 256 * MiB
    body_read_timeout_s: Annotated[
        PosFloat, _d("Longest silence while a request body arrives; beyond: 408.")
    ] = 30.0
    header_read_timeout_s: Annotated[
        PosFloat,
        _d("First byte of a request line -> end of its headers; a slowloris client is cut."),
    ] = 10.0
    keepalive_timeout_s: Annotated[
        PosFloat,
        _d(
            "An idle keep-alive (or silent new) connection is closed after this; aiohttp's "
            "3,630 s would let idle sockets exhaust the file descriptors."
        ),
    ] = 75.0
    max_connections: Annotated[
        PosInt,
        _d(
            "Client connections open at once on the proxy listener; beyond: 503 and close. "
            "Kept below the process's file limit (raised to fit when allowed)."
        ),
    ] = 4096
    client_write_timeout_s: Annotated[
        PosFloat,
        _d(
            "A client that stops reading an answer is cut after this long without progress "
            "(client_slow_reader)."
        ),
    ] = 300.0
    bad_request_log_interval_s: Annotated[
        PosFloat,
        _d("Malformed requests are counted; logged (redacted) at most once per this interval."),
    ] = 60.0


class CredentialsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which client headers and process variables may reach a candidate."""

    headers: Annotated[
        list[str],
        _d("Headers carrying a client's credentials: never sent on a copy unless forward_auth."),
    ] = msgspec.field(default_factory=lambda: sorted(CREDENTIAL_HEADERS))
    candidate_prefix: Annotated[
        str,
        _d(
            "A candidate's credentials_env may only name a variable with this prefix or in "
            'candidate_allow ("": the list only).'
        ),
    ] = "CANARY_CANDIDATE_"
    candidate_allow: Annotated[
        list[str], _d("Variables a candidate's credentials_env may name besides the prefix.")
    ] = msgspec.field(default_factory=list)


class MirrorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The mirror plane: one low-priority process per host copying traffic to candidates."""

    memory_budget_bytes: Annotated[PosInt, _d("All candidates' ring buffers together.")] = 256 * MiB
    shed_loop_lag_ms: Annotated[
        PosFloat,
        _d(
            "Average loop lag of the mirror process (over shed_window_s) above which copies "
            "are shed."
        ),
    ] = 20.0
    shed_cpu_busy: Annotated[
        Rate,
        _d(
            "Share of one core the mirror process may use before new copies are shed "
            "(0 = never): copies use only spare CPU."
        ),
    ] = 0.9
    shed_window_s: Annotated[
        PosFloat, _d("The mirror process sheds only on overload sustained over this window.")
    ] = 2.0
    dedup_window_s: Annotated[
        NonNegFloat, _d("Identical bodies sent within this window are mirrored once.")
    ] = 60.0
    channel_max_bytes: Annotated[
        PosInt,
        _d(
            "Per worker: bytes of copies queued toward the mirror process; past it a copy is "
            "dropped_overflow and production moves on."
        ),
    ] = 32 * MiB
    priority: Annotated[
        Priority,
        _d('CPU priority: "idle" (SCHED_IDLE where allowed, else nice), "nice", "normal".'),
    ] = "idle"
    nice: Annotated[Nice, _d("Nice value of the mirror process when nice is used.")] = 10
    results_max: Annotated[
        PosInt,
        _d(
            "Production results awaited for copies already offered; past it the oldest are "
            "results_lost."
        ),
    ] = 100_000
    score_logprobs: Annotated[
        Annotated[int, Meta(ge=1, le=20)],
        _d("Scoring copies: top-k logprobs asked per position (vLLM allows 20 by default)."),
    ] = 5
    score_concurrency: Annotated[
        PosInt, _d("Scoring requests in flight per endpoint (candidate or control).")
    ] = 1
    score_max_pending: Annotated[
        PosInt, _d("Scoring jobs held at once; past it a pair is not scored (score_dropped).")
    ] = 256


class ReportsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The report process: one per host runs every report, gate and promotion's report."""

    enabled: Annotated[
        bool,
        _d(
            "false: no report process on this replica; its reports, gate and promotions "
            "answer 503 reports_unavailable (another replica on the same store serves them)."
        ),
    ] = True
    priority: Annotated[
        Priority,
        _d('CPU priority: "idle" (SCHED_IDLE where allowed, else nice), "nice", "normal".'),
    ] = "idle"
    nice: Annotated[Nice, _d("Nice value of the report process when nice is used.")] = 10
    concurrency: Annotated[
        PosInt, _d("Reports computed at once (each holds its pairs in memory).")
    ] = 1
    max_pairs: Annotated[
        PosInt,
        _d(
            "A window with more pairs is refused (422 report_too_large) before it is read; "
            "10 M pairs take ~0.8 GiB resident and 2.3 GB of spill file."
        ),
    ] = 10_000_000
    spill_over_bytes: Annotated[
        PosInt,
        _d(
            "A window whose pair columns take more is assembled in an unlinked file and "
            "paged in a metric at a time."
        ),
    ] = 256 * MiB
    spill_dir: Annotated[
        str,
        _d(
            "Where that file goes (\"\": the SQLite database's directory, else the system's "
            "temporary directory); a disk, not a tmpfs."
        ),
    ] = ""
    queue_max: Annotated[PosInt, _d("Reports waiting for a slot; beyond: 503, counted.")] = 16
    timeout_s: Annotated[
        PosFloat, _d("A worker waits this long for the report process, then answers 503.")
    ] = 900.0
    start_wait_s: Annotated[
        NonNegFloat,
        _d("The gateway waits this long for its report process at start, then serves anyway."),
    ] = 10.0
    refresh_interval_s: Annotated[
        NonNegFloat,
        _d(
            "Every this many seconds each candidate's report segments are brought up to date; "
            "0 = on demand."
        ),
    ] = 60.0


class StorageConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The database and the writers that fill it."""

    db_url: Annotated[str, _d("sqlite+aiosqlite:///PATH or postgresql+asyncpg://user@host/db.")] = (
        "sqlite+aiosqlite:///./canary.db"
    )
    store_text: Annotated[
        bool, _d("false: store only hashes of outputs (no answer text kept).")
    ] = True
    store_text_max_chars: Annotated[
        NonNegInt, _d("Stored output text is truncated to this many characters.")
    ] = 4096
    writer_batch_size: Annotated[PosInt, _d("Observations per insert batch.")] = 500
    writer_flush_interval_s: Annotated[
        PosFloat, _d("A partial batch is written after this long.")
    ] = 0.5
    writer_queue_max: Annotated[
        PosInt, _d("Records waiting for the database; beyond: dropped and counted.")
    ] = 100_000
    registry_poll_interval_s: Annotated[
        PosFloat, _d("How often each replica checks the registry version.")
    ] = 2.0
    counters_flush_interval_s: Annotated[
        PosFloat, _d("How often mirror counters are saved for reports.")
    ] = 5.0


class CaptureConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Request bodies of a sample of mirrored conversations, for `canary capacity`."""

    enabled: Annotated[
        bool,
        _d(
            "Capture request bodies (redacted); with storage.store_text = false it also needs "
            "despite_store_text_off."
        ),
    ] = False
    share: Annotated[Rate, _d("Share of conversations captured (whole conversations).")] = 0.1
    candidates: Annotated[
        list[Name], _d("Only conversations mirrored to these candidates; [] = any.")
    ] = msgspec.field(default_factory=list)
    max_bytes: Annotated[
        PosInt, _d("Bytes of bodies kept within the retention age; beyond: new ones refused.")
    ] = 256 * MiB
    max_body_bytes: Annotated[PosInt, _d("A single body larger than this is refused.")] = 1 * MiB
    retention_s: Annotated[PosFloat, _d("Captures older than this are deleted.")] = 7 * 86400.0
    queue_max: Annotated[
        PosInt, _d("Bodies waiting for the database; bounds what a slow database costs.")
    ] = 10_000
    redact_fields: Annotated[
        list[str],
        _d('JSON fields stored as "[redacted]" (dotted paths, * for any key or item).'),
    ] = msgspec.field(default_factory=lambda: ["user"])
    redact_headers: Annotated[
        list[str], _d("Headers redacted besides Authorization and Proxy-Authorization.")
    ] = msgspec.field(default_factory=lambda: ["cookie", "x-api-key", "api-key"])
    despite_store_text_off: Annotated[
        bool, _d("true: capture even though storage.store_text = false.")
    ] = False


class AdminConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The admin API: tokens, its listener, and what failed logins cost."""

    token: Annotated[
        str | None,
        _d(
            "`token` or comma-separated `label:token` pairs (better in the environment); "
            "unset: the admin API answers 404 unless insecure."
        ),
    ] = None
    insecure: Annotated[
        bool, _d("Serve the admin API without a token (loopback listener only).")
    ] = False
    listen: Annotated[
        str | None, _d("The admin API's own HOST:PORT; unset: under /admin on the proxy's port.")
    ] = None
    max_connections: Annotated[PosInt, _d("The admin listener's own connection limit.")] = 64
    token_min_length: Annotated[PosInt, _d("Shorter admin tokens are refused at start-up.")] = 16
    auth_failures_allowed: Annotated[
        PosInt, _d("Failed authentications per peer before its back-off starts (429).")
    ] = 10
    auth_backoff_max_s: Annotated[PosFloat, _d("The back-off doubles from 1 s up to this.")] = 60.0


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every gateway setting, by section; docs/configuration.md lists each."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    live: LiveConfig = msgspec.field(default_factory=LiveConfig)
    upstream: UpstreamConfig = msgspec.field(default_factory=UpstreamConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    credentials: CredentialsConfig = msgspec.field(default_factory=CredentialsConfig)
    mirror: MirrorConfig = msgspec.field(default_factory=MirrorConfig)
    reports: ReportsConfig = msgspec.field(default_factory=ReportsConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    capture: CaptureConfig = msgspec.field(default_factory=CaptureConfig)
    admin: AdminConfig = msgspec.field(default_factory=AdminConfig)
    verdict: Annotated[
        dict[str, float],
        _d("Overrides of evaluators.judge.settings.VerdictSettings, by field name."),
    ] = msgspec.field(default_factory=dict)
    candidates: Annotated[
        list[CandidateConfig], _d("Candidates seeded into the registry on first start.")
    ] = msgspec.field(default_factory=list)


# Section name -> its Struct, in declaration order.
SECTIONS: Final[dict[str, type[msgspec.Struct]]] = {
    f.name: f.type
    for f in msgspec.structs.fields(GatewayConfig)
    if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)
}

# Flat keys of before the sections -> their dotted place (files and CANARY_<OLD_KEY> variables).
# fmt: off
FLAT_KEYS: Final[dict[str, str]] = {
    **{k: f"server.{k}" for k in (
        "listen", "workers", "log_format", "log_level", "replica_name", "event_loop",
        "session_header", "drain_timeout_s",
    )},
    **{f"live_{k}": f"live.{k}" for k in ("url", "name", "price_per_hour_usd", "gpus")},
    "upstream_max_connections": "upstream.max_connections",
    "upstream_keepalive_s": "upstream.keepalive_s",
    **{k: f"upstream.{k}" for k in (
        "connect_timeout_s", "ttfb_timeout_s", "idle_timeout_s", "total_timeout_s",
    )},
    **{k: f"limits.{k}" for k in (
        "max_body_bytes", "max_body_bytes_in_flight", "body_read_timeout_s",
        "header_read_timeout_s", "keepalive_timeout_s", "max_connections",
        "client_write_timeout_s", "bad_request_log_interval_s",
    )},
    "credential_headers": "credentials.headers",
    "candidate_credentials_prefix": "credentials.candidate_prefix",
    "candidate_credentials_allow": "credentials.candidate_allow",
    **{f"mirror_{k}": f"mirror.{k}" for k in (
        "memory_budget_bytes", "shed_loop_lag_ms", "shed_cpu_busy", "shed_window_s",
        "channel_max_bytes", "priority", "nice", "results_max",
    )},
    **{k: f"mirror.{k}" for k in (
        "dedup_window_s", "score_logprobs", "score_concurrency", "score_max_pending",
    )},
    "report_process": "reports.enabled",
    **{f"report_{k}": f"reports.{k}" for k in (
        "priority", "nice", "concurrency", "max_pairs", "spill_over_bytes", "spill_dir",
        "queue_max", "timeout_s", "start_wait_s", "refresh_interval_s",
    )},
    **{k: f"storage.{k}" for k in (
        "db_url", "store_text", "store_text_max_chars", "writer_batch_size",
        "writer_flush_interval_s", "writer_queue_max", "registry_poll_interval_s",
        "counters_flush_interval_s",
    )},
    "capture": "capture.enabled",
    **{f"capture_{k}": f"capture.{k}" for k in (
        "share", "candidates", "max_bytes", "max_body_bytes", "retention_s", "queue_max",
        "redact_fields", "redact_headers", "despite_store_text_off",
    )},
    "insecure_admin": "admin.insecure",
    **{f"admin_{k}": f"admin.{k}" for k in (
        "token", "listen", "max_connections", "token_min_length", "auth_failures_allowed",
        "auth_backoff_max_s",
    )},
}
# fmt: on

ENV_PREFIX = "CANARY_"


def _env_names() -> dict[str, str]:
    names = {ENV_PREFIX + old.upper(): dotted for old, dotted in FLAT_KEYS.items()}
    for section, cls in SECTIONS.items():
        for f in msgspec.structs.fields(cls):
            new = f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}"
            dotted = f"{section}.{f.name}"
            if names.setdefault(new, dotted) != dotted:
                raise ConfigError(f"{new} would name both {names[new]} and {dotted}")
    return names


# Every CANARY_ variable that configures the gateway -> its dotted key: the sectioned name
# (CANARY_REPORTS_MAX_PAIRS) and the flat name of before the sections (CANARY_REPORT_MAX_PAIRS).
ENV_VARIABLES: Final[dict[str, str]] = _env_names()


def _field_type(dotted: str) -> Any:
    section, _, key = dotted.partition(".")
    return {f.name: f.type for f in msgspec.structs.fields(SECTIONS[section])}[key]


def split_host_port(value: str) -> tuple[str, int]:
    """Parse `HOST:PORT` (IPv6 as `[::1]:8080`); raises ConfigError with the reason."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"port must be an integer in 0..65535, got {port!r}")
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


_WARNED: set[str] = set()


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
    seen: set[str] = set()
    for i, cand in enumerate(cfg.candidates):
        where = f"{source}: key 'candidates[{i}]"
        if reason := check_http_url(cand.url):
            raise ConfigError(f"{where}.url': {reason}")
        if cand.credentials_env and (
            reason := credential_env_refusal(cfg.credentials, cand.credentials_env)
        ):
            raise ConfigError(f"{where}.credentials_env': {reason}")
        if cand.name in seen or cand.name == cfg.live.name:
            raise ConfigError(f"{where}.name': duplicate endpoint name {cand.name!r}")
        seen.add(cand.name)
    capture = cfg.capture
    if capture.enabled and not cfg.storage.store_text and not capture.despite_store_text_off:
        raise ConfigError(
            f"{source}: key 'capture.enabled': storage.store_text = false keeps request bodies "
            "out of storage; set capture.despite_store_text_off = true to capture them anyway"
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
    for label, token in ((lbl, tok) for tok, lbl in parse_admin_tokens(cfg.token).items()):
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


class ConfigKey(msgspec.Struct, frozen=True, kw_only=True):
    """One setting as the reference documents it."""

    section: str  # "" for the top-level tables `verdict` and `candidates`
    key: str
    type: str
    default: Any
    description: str
    env: str | None  # the sectioned variable; None: not settable from the environment
    flat: str | None  # its flat name of before the sections


_JSON_TYPES: Final = {
    "integer": "int",
    "number": "float",
    "string": "str",
    "boolean": "bool",
    "null": "unset",
    "object": "table",
}


def _type_text(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(f'"{v}"' for v in prop["enum"])
    if "anyOf" in prop:
        return " | ".join(_type_text(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return "table"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list[{_type_text(prop.get('items', {}))}]"
    text = _JSON_TYPES.get(kind, kind)
    bounds = [
        f"{op} {prop[name]}"
        for name, op in (
            ("exclusiveMinimum", ">"),
            ("minimum", ">="),
            ("exclusiveMaximum", "<"),
            ("maximum", "<="),
        )
        if name in prop
    ]
    if "pattern" in prop:
        bounds.append(f"matching {prop['pattern']}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def reference() -> list[ConfigKey]:
    """Every setting with its type, default and description, from the declaration above."""
    schema = msgspec.json.schema(GatewayConfig)
    defs = schema["$defs"]
    flat_of = {dotted: old for old, dotted in FLAT_KEYS.items()}
    defaults = msgspec.to_builtins(GatewayConfig())
    out: list[ConfigKey] = []
    for section, cls in SECTIONS.items():
        for key, prop in defs[cls.__name__]["properties"].items():
            dotted = f"{section}.{key}"
            out.append(
                ConfigKey(
                    section=section,
                    key=key,
                    type=_type_text(prop),
                    default=defaults[section].get(key),
                    description=prop.get("description", ""),
                    env=f"{ENV_PREFIX}{section.upper()}_{key.upper()}",
                    flat=flat_of.get(dotted),
                )
            )
    top = defs[GatewayConfig.__name__]["properties"]
    out += [
        ConfigKey(
            section="",
            key=key,
            type="table" if key == "verdict" else "array of tables",
            default=defaults[key],
            description=top[key].get("description", ""),
            env=None,
            flat=None,
        )
        for key in ("verdict", "candidates")
    ]
    return out
