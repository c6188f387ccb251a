"""The gateway's settings, declared once: one frozen Struct per section and `GatewayConfig`.

Settings come in sections, one per concern (`[server]`, `[live]`, `[upstream]`, `[limits]`,
`[credentials]`, `[mirror]`, `[reports]`, `[storage]`, `[capture]`, `[admin]`, `[verdict]`,
`[[candidates]]`); each plane receives the sections it uses, only the wiring (gateway/process,
gateway/cli) sees the whole `GatewayConfig`. Every field carries its description in its
declaration (`gateway.config.reference` lists them; docs/configuration.md is generated from it).
The other names a setting goes by (flat keys of before the sections, `CANARY_` variables) are
in gateway.config.names. Reads nothing: gateway.config.load does.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from domain.endpoint import (
    CandidateSpec,
    Endpoint,
    Gpus,
    MiB,
    Name,
    Price,
    Rate,
)
from domain.errors import ConfigError

# Headers that carry a client's credentials (`[credentials] headers` replaces the list):
# OpenAI's and vLLM's `Authorization`, Azure OpenAI's `api-key`, gateways' `x-api-key`, browser
# sessions' `Cookie`, and `Proxy-Authorization`. A copy goes to a URL an admin chose: none of
# them reaches it unless the candidate says `forward_auth`.
CREDENTIAL_HEADERS: Final = frozenset(
    ("authorization", "api-key", "x-api-key", "cookie", "proxy-authorization")
)


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
    answer_wait_s: Annotated[
        Annotated[float, Meta(gt=0, le=3600)],
        _d(
            "A scoring job or a grading pair waits for a copy's answer the copy's timeout_s plus "
            "this, counted from when a worker takes the copy (a copy still queued is waited for "
            "up to an hour; one dropped unsent is not); past it the pair is neither scored nor "
            "graded (score_dropped; grading dropped, no_answer)."
        ),
    ] = 60.0
    token_counter: Annotated[
        # Long enough for a path: "local:/models/<model>/tokenizer.json".
        Annotated[str, Meta(min_length=1, max_length=4096)],
        _d(
            "What counts every arm's output tokens (text and tool calls): "
            '"local:<path>" (recommended: the model\'s tokenizer.json, or its folder, read in the '
            'mirror process; no engine is asked), or the /tokenize of an engine: "auto" (the '
            'control, else the first candidate by name) or a candidate\'s name; or "off". Never '
            "the live engine (an SSE event is not a token; docs/metrics.md)."
        ),
    ] = "auto"
    tokenize_concurrency: Annotated[
        PosInt,
        _d("Token-counting requests in flight to the tokenizer engine at once (not local)."),
    ] = 4
    tokenize_max_pending: Annotated[
        PosInt,
        _d(
            "Answers waiting to be counted; past it an answer is stored uncounted "
            '(canary_mirror_token_counts_total{outcome="overflow"}).'
        ),
    ] = 10_000
    tokenize_timeout_s: Annotated[
        PosFloat, _d("Deadline of one /tokenize request; past it the answer is stored uncounted.")
    ] = 5.0
    tokenize_cache_entries: Annotated[
        PosInt,
        _d("Counts remembered by text hash (identical answers are counted once per tokenizer)."),
    ] = 65_536
    grading_max_pending: Annotated[
        PosInt,
        _d(
            "Pairs waiting for an LLM grader (for their answers or in its queue) at once; past "
            "it a pair is not graded (canary_grading_dropped_total)."
        ),
    ] = 256
    grading_concurrency: Annotated[
        PosInt,
        _d(
            "Gradings in flight to the graders at once (each a call of up to grading_timeout_s): "
            "one at a time a 1 s grader keeps up with 1 pair a second at most."
        ),
    ] = 8
    grading_timeout_s: Annotated[PosFloat, _d("Seconds one call to a grader may take.")] = 60.0
    grading_max_chars: Annotated[
        PosInt,
        _d("Characters of the conversation and of each answer shown to a grader at most."),
    ] = 8000
    tool_check: Annotated[
        bool,
        _d(
            "Check every arm's tool calls against the request's declared tools, tool_choice "
            "and parallel_tool_calls (the tool_validity metric); false: not checked, and the "
            "metric says so."
        ),
    ] = True
    tool_schema_cache: Annotated[
        PosInt,
        _d(
            "Compiled tool schemas kept (by hash) in the mirror process; past it the least "
            'recently used is dropped (canary_mirror_tool_schemas_total{outcome="evicted"}).'
        ),
    ] = 256
    tool_schema_max_bytes: Annotated[
        PosInt,
        _d(
            "Largest declared tool schema compiled, in bytes: a client's schema is untrusted "
            "input; a bigger one makes its answers uncheckable (counted, never judged)."
        ),
    ] = 65536


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
    labeller_token: Annotated[
        str | None,
        _d(
            "Labeller tokens, as `token`: they may label graded pairs (/admin/labels) and "
            "nothing else; a label records the token's label."
        ),
    ] = None
    label_retention_s: Annotated[
        PosFloat,
        _d("Text of the pairs kept for labelling is deleted this long after grading."),
    ] = 30 * 86400.0
    label_double_rate: Annotated[
        Rate,
        _d("Share of kept pairs offered to a second labeller (people's agreement)."),
    ] = 0.1


class RolloutConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ramp on live traffic: the session-arm table, the workers' guards, the controller."""

    arms_slots: Annotated[
        PosInt,
        _d("Slots of the host's session -> arm table (a power of two; 8 bytes each)."),
    ] = 1_048_576
    arms_ttl_s: Annotated[
        PosFloat, _d("A session unseen for this long is forgotten (its slot is reused).")
    ] = 3600.0
    arms_dir: Annotated[
        str, _d('Directory of the session-arm table\'s file; "" = /dev/shm, else the temp dir.')
    ] = ""
    # Sized so that a candidate equal to production, at 10 new sessions/s with 2 % of its
    # three-turn sessions failing, trips a guard in ~0.04 % of default rollouts, within the
    # guards' 5 % share of alpha (evaluators/rollout/guards.py; `canary plan` states it at your
    # failing share); a dead candidate still trips the consecutive guard at its 5th request.
    guard_consecutive_failures: Annotated[
        PosInt, _d("This many candidate failures in a row roll the rollout back at once.")
    ] = 5
    guard_burst_window: Annotated[
        PosInt,
        _d(
            "The last this many counted candidate requests are watched for a burst of failing "
            "sessions (a session's further failures while it is in the window are not counted)."
        ),
    ] = 50
    guard_burst_failures: Annotated[
        PosInt,
        _d("This many failing sessions within the burst window roll the rollout back at once."),
    ] = 10
    retry_on_production: Annotated[
        bool, _d("Retry once on production a candidate failure before the first byte.")
    ] = True
    controller_interval_s: Annotated[
        PosFloat, _d("How often the rollout controller judges the current step.")
    ] = 2.0
    default_min_step_s: Annotated[
        PosFloat, _d("Shortest dwell of a step when a rollout does not set min_step_s.")
    ] = 60.0
    evidence_queue_max: Annotated[
        PosInt, _d("Ramp records waiting for the mirror process; beyond: dropped and counted.")
    ] = 100_000
    # Without its store no controller judges the ramp, no operator can pause or abort it, and a
    # rollback decided on another replica cannot reach this one; only the local guards still
    # watch. 10 s rides out a dropped connection or a pooler restart (five of the controller's
    # 2 s looks missed) and is short against a primary failover (10-30 s), during which the
    # candidate only gets no new sessions: the cheap side to err on.
    store_loss_hold_s: Annotated[
        PosFloat,
        _d(
            "A worker that has not read the store for this long sends new sessions to "
            "production (sessions already on the candidate keep it) until the store is back."
        ),
    ] = 10.0
    # A guard's rollback decided without the store is retried with back-off up to this far
    # apart, never dropped: once the store answers it is stored within about this long.
    store_retry_max_s: Annotated[
        PosFloat, _d("Longest pause between two attempts to store a worker's guard rollback.")
    ] = 1.0
    # Longer than store_retry_max_s (checked): a rollback another replica decided while the
    # store was gone is stored before this worker goes back to the stored (stale) weight.
    store_resume_after_s: Annotated[
        PosFloat,
        _d(
            "A held worker resumes the stored weight once the store has answered this long "
            "(more than store_retry_max_s)."
        ),
    ] = 5.0


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
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    verdict: Annotated[
        dict[str, float | str],
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


def split_host_port(value: str) -> tuple[str, int]:
    """Parse `HOST:PORT` (IPv6 as `[::1]:8080`); raises ConfigError with the reason."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"port must be an integer in 0..65535, got {port!r}")
    return host, int(port)
