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

# Headers that carry a client's credentials (`credential_headers` in the config replaces the
# list): OpenAI's and vLLM's `Authorization`, Azure OpenAI's `api-key`, gateways' `x-api-key`,
# browser sessions' `Cookie`, and `Proxy-Authorization`. A copy goes to a URL an admin chose:
# none of them reaches it unless the candidate says `forward_auth`.
CREDENTIAL_HEADERS: Final = frozenset(
    ("authorization", "api-key", "x-api-key", "cookie", "proxy-authorization")
)


_NAME_RE = re.compile(NAME_PATTERN)

PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]


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
    # The event loop of every process: uvloop when installed ("auto"), or asyncio's own.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"

    # --- the live endpoint (None: start the built-in engine simulator as the live endpoint).
    # `live_<field>` is the live `Endpoint`'s <field>, with the type declared there
    # (tests/process/test_config.py checks they agree).
    live_url: str | None = None
    live_name: Name = "live"
    live_price_per_hour_usd: Price | None = None
    live_gpus: Gpus = 1

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

    # --- mirror plane (one low-priority mirror process per host; see gateway/mirror/plane.py)
    # Bytes of copies one worker may have queued toward the mirror process (beyond the kernel's
    # socket buffer): past it a copy is `dropped_overflow` and production moves on. Bounded so a
    # stalled mirror process costs each worker at most this much memory.
    mirror_channel_max_bytes: PosInt = 32 * MiB
    # Sustained overload of the mirror process itself: its loop lag averaged over this window
    # (one late wake-up on a busy host moves it little) and its CPU share over the same window.
    mirror_shed_window_s: PosFloat = 2.0
    # "idle": SCHED_IDLE where the kernel allows it (only CPU nobody else wants), else nice;
    # "nice": nice only; "normal": the same priority as production (benchmarks, debugging).
    mirror_priority: Literal["idle", "nice", "normal"] = "idle"
    mirror_nice: Annotated[int, Meta(ge=0, le=19)] = 10
    # Production results awaited for copies already offered; a worker that died leaves its
    # exchanges here until this bound or their age evicts them (counted `results_lost`).
    mirror_results_max: PosInt = 100_000
    # Scoring copies (gateway/mirror/scoring/forced.py): top-k logprobs asked per position (vLLM's
    # max_logprobs is 20 by default), scoring requests in flight per endpoint, and scoring jobs
    # held at once (each holds its arms' observations and a reference to the request body);
    # past it a pair is not scored (`score_dropped`).
    score_logprobs: Annotated[int, Meta(ge=1, le=20)] = 5
    score_concurrency: PosInt = 1
    score_max_pending: PosInt = 256

    # --- report process (one per host: every report, gate and promotion's report runs there,
    # never in a worker; see gateway/control/reports.py)
    # false: this replica starts no report process and refreshes no report segments; its
    # reports, gate and promotions answer 503 `reports_unavailable` saying so. For fleets whose
    # production replicas must carry no report work at all (on small hosts even idle-priority
    # work shows in production's tail): a replica that takes no production traffic, on the same
    # PostgreSQL store, serves reports, the gate and promotions.
    report_process: bool = True
    # "idle": SCHED_IDLE where allowed, else nice (a saturated host delays reports, never
    # production); "nice": nice only; "normal": production's priority.
    report_priority: Literal["idle", "nice", "normal"] = "idle"
    report_nice: Annotated[int, Meta(ge=0, le=19)] = 10
    report_concurrency: PosInt = 1  # reports computed at once (each holds its pairs in memory)
    # A window with more pairs is refused (422 `report_too_large`, counted) before its columns
    # are allocated or read, so one huge candidate cannot run the host out of memory or disk
    # beside production. 10,000,000 pairs (a day at 1,000 requests/s sampled at 10 %) take
    # ~0.8 GiB resident and 2.3 GB of spill file (below); `canary report` is not bound.
    report_max_pairs: PosInt = 10_000_000
    # A window whose pair columns (~230 bytes a pair) would take more than this is assembled in
    # an unlinked file instead of the heap and paged in a metric at a time
    # (evaluators.pairs.spill): resident memory is then the interpreter plus one metric's
    # columns and temporaries (~70 bytes a pair at the peak) instead of ~330 bytes a pair. The
    # file goes to `report_spill_dir` ("": the SQLite database's directory, else the system's
    # temporary directory), which must be a disk, not a tmpfs.
    report_spill_over_bytes: PosInt = 256 * MiB
    report_spill_dir: str = ""
    report_queue_max: PosInt = 16  # reports waiting for a slot; beyond: 503, counted
    report_timeout_s: PosFloat = 900.0  # a worker waits this long for the report process
    # The gateway waits this long for its report process to listen before it serves, and no
    # longer: at idle priority on a busy host the report process starts when a CPU is spare,
    # which production must not wait for (reports answer 503 `reports_unavailable` until then).
    report_start_wait_s: NonNegFloat = 10.0
    # Every this many seconds the report process brings each active candidate's stored report
    # segments up to date (evaluators.pairs.segments), so a report reads columns instead of
    # rows; 0 = only when a report is asked for. A minute keeps the rows a report must still
    # build to about two minutes of traffic.
    report_refresh_interval_s: NonNegFloat = 60.0

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

    # --- hardening: client limits, credential policy, admin exposure
    # Bytes of request bodies held by requests in flight, all together: without it, a few slow
    # uploads just under max_body_bytes hold gigabytes. Beyond it: 503 `gateway_overloaded`.
    max_body_bytes_in_flight: PosInt = 256 * MiB
    # Longest silence while a request body arrives: a client that stops sending gets 408.
    body_read_timeout_s: PosFloat = 30.0
    # First byte of a request line -> end of its headers: a slowloris client is cut after it.
    header_read_timeout_s: PosFloat = 10.0
    # An idle keep-alive connection (or one that sends nothing) is closed after this; aiohttp's
    # default is 3,630 s, enough for idle sockets to exhaust the file descriptors.
    keepalive_timeout_s: PosFloat = 75.0
    # Client connections open at once on the proxy listener; beyond it a new connection gets a
    # 503 and is closed. Kept below the process's file limit (raised to fit when allowed).
    max_connections: PosInt = 4096
    # A client that stops reading an answer is cut after this long without progress (its own
    # error kind, `client_slow_reader`), so it cannot pass for the live endpoint's idle timeout.
    client_write_timeout_s: PosFloat = 300.0
    # Headers that carry a client's credentials: never sent on a copy unless `forward_auth`.
    credential_headers: list[str] = msgspec.field(
        default_factory=lambda: sorted(CREDENTIAL_HEADERS)
    )
    # `credentials_env` may only name variables with this prefix or in the allow-list: a
    # candidate URL chosen by an admin must never receive another secret of the process.
    candidate_credentials_prefix: str = "CANARY_CANDIDATE_"
    candidate_credentials_allow: list[str] = msgspec.field(default_factory=list)
    # Malformed requests are counted; their log line (redacted) at most once per this interval.
    bad_request_log_interval_s: PosFloat = 60.0
    # The admin API on its own listener (HOST:PORT); None: under /admin on the proxy's port.
    admin_listen: str | None = None
    admin_max_connections: PosInt = 64  # the admin listener's own limit: headroom kept apart
    admin_token_min_length: PosInt = 16  # shorter admin tokens are refused at start-up
    # Per peer: after this many failed admin authentications, each further attempt is refused
    # (429) for a back-off doubling from 1 s up to admin_auth_backoff_max_s.
    admin_auth_failures_allowed: PosInt = 10
    admin_auth_backoff_max_s: PosFloat = 60.0

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
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        # Paths are appended to the base URL: `…/base?x=1` + `/v1/chat/completions` would send
        # every request to `/base?x=1…`.
        return "URL must not have a query (?…) or fragment (#…): request paths are appended to it"
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
    _check_hardening(cfg, source)
    seen: set[str] = set()
    for i, cand in enumerate(cfg.candidates):
        where = f"{source}: key 'candidates[{i}]"
        if reason := check_http_url(cand.url):
            raise ConfigError(f"{where}.url': {reason}")
        if cand.credentials_env and (reason := credential_env_refusal(cfg, cand.credentials_env)):
            raise ConfigError(f"{where}.credentials_env': {reason}")
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


_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


def settings_variables() -> frozenset[str]:
    """The environment variables that configure the gateway (never a candidate credential)."""
    return frozenset(ENV_PREFIX + name.upper() for name in _FIELDS)


def credential_env_refusal(cfg: GatewayConfig, name: str) -> str | None:
    """Why a candidate's `credentials_env` may not name `name` under `cfg` (None: it may)."""
    if name in settings_variables():
        return f"{name} configures the gateway itself and is never sent to a candidate"
    return env_name_refusal(
        name, cfg.candidate_credentials_prefix, frozenset(cfg.candidate_credentials_allow)
    )


def _check_hardening(cfg: GatewayConfig, source: str) -> None:
    prefix = cfg.candidate_credentials_prefix
    if prefix and (not _ENV_NAME_RE.match(prefix) or prefix in (ENV_PREFIX, "_")):
        raise ConfigError(
            f"{source}: key 'candidate_credentials_prefix': must be an environment variable "
            f'prefix (A-Z, 0-9, _) narrower than {ENV_PREFIX!r}, or "" for the allow-list only,'
            f" got {prefix!r}"
        )
    for i, name in enumerate(cfg.candidate_credentials_allow):
        if not _ENV_NAME_RE.match(name) or name in settings_variables():
            raise ConfigError(
                f"{source}: key 'candidate_credentials_allow[{i}]': {name!r} is not a variable "
                "a candidate may receive (A-Z, 0-9, _; not a CANARY_ setting)"
            )
    for i, header in enumerate(cfg.credential_headers):
        if not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", header):
            raise ConfigError(
                f"{source}: key 'credential_headers[{i}]': not a header name: {header!r}"
            )
    for label, token in ((lbl, tok) for tok, lbl in parse_admin_tokens(cfg.admin_token).items()):
        if len(token) < cfg.admin_token_min_length:
            raise ConfigError(
                f"{source}: key 'admin_token' (CANARY_ADMIN_TOKEN): the token labelled "
                f"{label!r} has {len(token)} characters, fewer than admin_token_min_length = "
                f"{cfg.admin_token_min_length}; generate one with `openssl rand -hex 24`"
            )
    if cfg.admin_listen is not None:
        try:
            split_host_port(cfg.admin_listen)
        except ValueError as exc:
            raise ConfigError(f"{source}: key 'admin_listen': {exc}") from exc
        if cfg.admin_listen == cfg.listen and cfg.listen_port != 0:
            raise ConfigError(
                f"{source}: key 'admin_listen': same address as 'listen'; leave it unset to "
                "serve the admin API on the proxy's port"
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
