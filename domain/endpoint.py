"""The endpoint: one serving endpoint (live, candidate or retired) and its bounded fields.

This is the one home of the endpoint noun. `CandidateSpec` declares each field once (name,
bounded type, default, description): what an operator declares (a `[[candidates]]` table of the
config file and the body of `POST /admin/candidates`). `Endpoint`, what storage keeps and every
plane reads, is the spec plus role and bookkeeping; `CandidatePatch` (what a `PATCH` may change)
is generated from the spec. The admin views, the table's columns and the CLI flags are derived
from these by their own modules. The bounds also keep storage honest: 32-bit integer
columns, no NUL bytes in text (PostgreSQL refuses them), no credentials inside a URL.
Pure: no IO.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, cast

import msgspec
from msgspec import UNSET, Meta, UnsetType

MiB = 1024 * 1024

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"

Role = Literal["live", "candidate", "retired"]

# The one set of defaults of a candidate (config file, admin API and stored record agree).
DEFAULT_SAMPLE_RATE = 0.1
DEFAULT_BUFFER_MAX_ITEMS = 1024
DEFAULT_BUFFER_MAX_BYTES = 64 * MiB
DEFAULT_CONCURRENCY = 4
DEFAULT_TIMEOUT_S = 300.0

Name = Annotated[
    str, Meta(max_length=63, pattern=NAME_PATTERN, description="Endpoint name: " + NAME_PATTERN)
]
# http(s), a host without userinfo (credentials never travel inside a URL): a name, or an IPv6
# literal in brackets; an optional port in 0..65535, then a printable path without ? or # (paths
# are appended to it, so a query or fragment would misroute every request). Precise enough
# that every string it admits passes gateway.config.check_http_url, which the handler runs
# as well.
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join(
    (
        f"({_H16}:){{7}}{_H16}",
        f"({_H16}:){{1,7}}:",
        f"({_H16}:){{1,6}}:{_H16}",
        f"({_H16}:){{1,5}}(:{_H16}){{1,2}}",
        f"({_H16}:){{1,4}}(:{_H16}){{1,3}}",
        f"({_H16}:){{1,3}}(:{_H16}){{1,4}}",
        f"({_H16}:){{1,2}}(:{_H16}){{1,5}}",
        f"{_H16}:(:{_H16}){{1,6}}",
        f":((:{_H16}){{1,7}}|:)",
    )
)
_PORT = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
URL_PATTERN = rf"^https?://(\[({_IPV6})\]|[A-Za-z0-9._~-]+)(:{_PORT})?(/[^\s\x00-\x1f\x7f?#]*)?$"
Url = Annotated[
    str,
    Meta(
        max_length=2048,
        pattern=URL_PATTERN,
        description="Base URL: absolute http(s), no userinfo",
        extra={"metavar": "URL"},
    ),
]
_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Kind = Annotated[str, Meta(max_length=32, pattern=_PRINTABLE)]
Model = Annotated[str, Meta(min_length=1, max_length=200, pattern=_PRINTABLE)]
EnvName = Annotated[
    str,
    Meta(
        max_length=128,
        pattern=r"^[A-Z_][A-Z0-9_]{0,127}$",
        description="NAME of an environment variable of the gateway holding the candidate's "
        "credential; the secret itself is never accepted, stored or returned",
        extra={"metavar": "VAR"},
    ),
]


def env_name_refusal(
    name: str, prefix: str, allowed: frozenset[str] | tuple[str, ...]
) -> str | None:
    """Why `credentials_env` may not name `name` (None: it may). Only variables meant for
    candidates qualify: `prefix` + a suffix, or a name of the operator's allow-list; any other
    variable of the gateway (the admin token, the database URL, cloud keys) is never sent."""
    if name in allowed or (prefix and name.startswith(prefix) and len(name) > len(prefix)):
        return None
    allow = f" or one of {sorted(allowed)}" if allowed else ""
    return (
        f"must name a variable meant for candidates: starting with {prefix!r}{allow} "
        "(candidate_prefix / candidate_allow in the config file's [credentials] table)"
    )


Reason = Annotated[str, Meta(max_length=2000, pattern=r"^[^\x00]*$")]
Rate = Annotated[float, Meta(ge=0.0, le=1.0)]
# Copies per second a candidate asks for (adaptive sampling, gateway.mirror.sampling.rate); the
# upper
# bound only keeps nonsense out: no host offers a million requests a second.
MAX_TARGET_RPS = 1_000_000.0
TargetRps = Annotated[float, Meta(gt=0.0, le=MAX_TARGET_RPS)]
Items = Annotated[int, Meta(ge=1, le=1_000_000)]
Bytes = Annotated[int, Meta(ge=1, le=1 << 40)]
Concurrency = Annotated[int, Meta(ge=1, le=4096)]
Timeout = Annotated[float, Meta(ge=0.001, le=86_400.0)]
Price = Annotated[float, Meta(ge=0.0, le=1_000_000.0)]
Gpus = Annotated[int, Meta(ge=1, le=4096)]
VerdictKey = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Verdict = Annotated[
    dict[VerdictKey, float | str],
    Meta(description="Overrides of evaluators.judge.settings.VerdictSettings fields, by name"),
]
Sampling = Literal["request", "session"]
State = Literal["active", "paused"]
VerdictValue = Literal["promote", "hold", "reject"]

# What a failed pattern means, by field: msgspec's message would quote the regex.
PATTERN_REASONS = {
    "name": f"must match {NAME_PATTERN} (lowercase letters, digits, - and _)",
    "url": "must be an absolute http(s) URL with a host, a port in 0..65535, no "
    "user:password@ (use credentials_env for credentials) and no query or fragment (request "
    "paths are appended to it)",
    "credentials_env": "must be the NAME of an environment variable of the gateway "
    "(A-Z, 0-9, _), never the secret itself",
    "kind": "must not contain control characters",
    "model": "must not contain control characters",
    "reason": "must not contain NUL characters",
    "verdict": "keys must be verdict setting names (lowercase letters, digits, _)",
    "prompt": "must contain both answers' placeholders {answer_a} and {answer_b} (and "
    "{conversation} for the user's conversation), and no NUL characters",
}


def _doc(text: str, metavar: str = "", unit: str = "") -> Meta:
    """A field's description (the OpenAPI document and the CLI flag's help share it), and
    optionally the CLI's metavar and the unit its parse error names."""
    extra = {k: v for k, v in (("metavar", metavar), ("unit", unit)) if v}
    return Meta(description=text, extra=extra or None)


# --- the grader of a model upgrade (docs/grading.md) ----------------------------------------------

# The defaults of a grader: every pair graded, a quarter of them in both orders, at most one
# grader call a second, two million tokens a day.
DEFAULT_GRADER_RATE = 1.0
DEFAULT_SWAP_RATE = 0.25
DEFAULT_GRADER_MAX_PER_MINUTE = 60
DEFAULT_GRADER_DAILY_TOKENS = 2_000_000
# Placeholders a grading prompt template fills in (gateway.mirror.grading.request).
PROMPT_FIELDS = ("conversation", "answer_a", "answer_b")
# Both answers must appear in a template: a grader shown one answer cannot prefer either.
_PROMPT_PATTERN = r"^(?=[\s\S]*\{answer_a\})(?=[\s\S]*\{answer_b\})[^\x00]*$"
GradeRate = Annotated[float, Meta(gt=0.0, le=1.0)]


class GraderSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An LLM grader of a candidate that answers differently on purpose (a model upgrade): an
    OpenAI-compatible endpoint shown each graded pair blind, in an order decided by hash; the
    candidate then gates quality on preference (evaluators.metrics.preference)."""

    url: Url
    model: Annotated[Model, _doc("Model name sent to the grader")]
    rate: Annotated[
        GradeRate, _doc("Share of complete pairs graded, by hash (nested like sampling)", "0..1")
    ] = DEFAULT_GRADER_RATE
    swap_rate: Annotated[
        Rate, _doc("Share of graded pairs graded in both orders (position bias, flips)", "0..1")
    ] = DEFAULT_SWAP_RATE
    max_per_minute: Annotated[
        Annotated[int, Meta(ge=1, le=1_000_000)], _doc("Grader calls per minute at most")
    ] = DEFAULT_GRADER_MAX_PER_MINUTE
    daily_token_budget: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 40)],
        _doc("Grader tokens (prompt + completion) per UTC day at most", unit="tokens"),
    ] = DEFAULT_GRADER_DAILY_TOKENS
    price_per_mtok: Annotated[
        Price, _doc("Price of one million grader tokens, in USD (the report's cost)", "USD")
    ] = 0.0
    label_rate: Annotated[
        Rate,
        _doc(
            "Share of graded sessions kept for people to label, by hash of the session "
            "(docs/grading.md, People check the grader)",
            "0..1",
        ),
    ] = 0.0
    credentials_env: EnvName | None = None
    prompt: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=20_000,
                pattern=_PROMPT_PATTERN,
                description="Prompt template with {conversation}, {answer_a} and {answer_b} "
                "(null: the documented default rubric)",
            ),
        ]
        | None
    ) = None


# --- the declaration --------------------------------------------------------------------------
#
# Each candidate field is declared once, below: its name, bounded type, default and description.
# What follows from it: `Endpoint` (adds role and bookkeeping), `CandidatePatch` and
# `MUTABLE_FIELDS` (generated here), the admin API's views (gateway.control.admin.schema), the
# `endpoints` table's columns (storage.models), the `canary candidates add|update` flags
# (gateway.cli.commands.candidates) and the `[[candidates]]` config table (gateway.config).


class CandidateSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A candidate as an operator declares it: the body of `POST /admin/candidates` and a
    `[[candidates]]` table of the config file (one type, one set of defaults)."""

    name: Name
    url: Url
    kind: Annotated[Kind, _doc("Free label, e.g. quantized, bi-kv, control", "LABEL")] = ""
    model: (
        Annotated[Model, _doc("Model name sent to the candidate instead of the client's")] | None
    ) = None
    sample_rate: Annotated[
        Rate,
        _doc("Share of traffic mirrored (with target_rps: the most that may be mirrored)", "0..1"),
    ] = DEFAULT_SAMPLE_RATE
    # When set, the share mirrored adapts so copies/s approach it; sample_rate is the ceiling.
    target_rps: (
        Annotated[
            TargetRps,
            _doc(
                "Copies per second wanted from this gateway host: the share mirrored adapts to "
                "the traffic, never above sample_rate (null: the fixed sample_rate)",
                unit="copies per second",
            ),
        ]
        | None
    ) = None
    sampling: Annotated[Sampling, _doc("Sample by request or by whole session")] = "request"
    # Teacher-forced scoring of production's answers (gateway/mirror/scoring/forced.py); None: the
    # kind's default (domain.kinds.SCORE_RATES: 0.1 for quantized, 0 for the others).
    score_rate: (
        Annotated[
            Rate,
            _doc(
                "Share of this candidate's pairs whose production answer it (and the control) "
                "score with prompt logprobs (null: 0.1 for kind quantized, else 0)",
                "0..1",
            ),
        ]
        | None
    ) = None
    buffer_max_items: Annotated[Items, _doc("Copies the ring buffer holds at most")] = (
        DEFAULT_BUFFER_MAX_ITEMS
    )
    buffer_max_bytes: Annotated[Bytes, _doc("Bytes the ring buffer holds at most", "BYTES")] = (
        DEFAULT_BUFFER_MAX_BYTES
    )
    concurrency: Annotated[Concurrency, _doc("Copies in flight at most")] = DEFAULT_CONCURRENCY
    timeout_s: Annotated[Timeout, _doc("Seconds a copy may take", "SECONDS")] = DEFAULT_TIMEOUT_S
    price_per_hour_usd: (
        Annotated[Price, _doc("Price of the candidate's hardware per hour, in USD", "USD")] | None
    ) = None
    gpus: Annotated[Gpus, _doc("GPUs the candidate uses")] = 1
    credentials_env: EnvName | None = None
    forward_auth: Annotated[
        bool, _doc("Forward the client's Authorization header to the candidate")
    ] = False
    state: Annotated[State, _doc("paused: registered, not mirrored")] = "active"
    verdict: Verdict = msgspec.field(default_factory=dict)
    # A model upgrade's grader: with one, quality gates on preference (docs/grading.md).
    grader: GraderSpec | None = None

    def to_endpoint(self) -> Endpoint:
        return Endpoint(role="candidate", **msgspec.structs.asdict(self))


class Endpoint(CandidateSpec, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One serving endpoint: the live one, a candidate, or a retired former live one; the
    declared fields plus its role and storage's bookkeeping."""

    role: Role = "candidate"
    version: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0


class _Patch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    def changes(self) -> dict[str, Any]:
        """The fields that were given, by name."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}


def _patch_type() -> type[_Patch]:
    fields: list[tuple[str, Any, Any]] = [
        ("role", Literal["candidate", "retired"] | UnsetType, UNSET)
    ]
    fields.extend(
        (f.name, Union[f.type, UnsetType], UNSET)  # noqa: UP007 - f.type is a runtime object
        for f in msgspec.structs.fields(CandidateSpec)
        if f.name != "name"
    )
    patch = msgspec.defstruct(
        "CandidatePatch",
        fields,
        bases=(_Patch,),
        module=__name__,
        kw_only=True,
        forbid_unknown_fields=True,
    )
    patch.__doc__ = (
        "Body of `PATCH /admin/candidates/{name}`: only the fields given change; `null` clears "
        "a nullable field. The name is not mutable; the role moves between candidate and "
        "retired only (retired: kept for rollback, not mirrored); promote and rollback change "
        "the live one."
    )
    return cast("type[_Patch]", patch)


# Every field of a candidate but its name, each optional (UNSET: not given).
CandidatePatch = _patch_type()
MUTABLE_FIELDS: tuple[str, ...] = CandidatePatch.__struct_fields__
