"""The endpoint: one serving endpoint (live, candidate or retired) and its bounded fields.

This is the one home of the endpoint noun: `Endpoint` is what storage keeps and every plane
reads; `CandidateSpec` is what an operator declares (a `[[candidates]]` table of the config file
and the body of `POST /admin/candidates`), `CandidatePatch` what a `PATCH` may change. Each field
has one bounded type and one default, here. The bounds also keep storage honest: 32-bit integer
columns, no NUL bytes in text (PostgreSQL refuses them), no credentials inside a URL.
Pure: no IO.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

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

Name = Annotated[str, Meta(pattern=NAME_PATTERN, description="Endpoint name: " + NAME_PATTERN)]
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
    Meta(max_length=2048, pattern=URL_PATTERN, description="Absolute http(s) URL, no userinfo"),
]
_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Kind = Annotated[str, Meta(max_length=32, pattern=_PRINTABLE, description="Free label")]
Model = Annotated[str, Meta(min_length=1, max_length=200, pattern=_PRINTABLE)]
EnvName = Annotated[
    str,
    Meta(
        pattern=r"^[A-Z_][A-Z0-9_]{0,127}$",
        description="NAME of an environment variable of the gateway holding the candidate's "
        "credential; the secret itself is never accepted, stored or returned",
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
        "(candidate_credentials_prefix / candidate_credentials_allow in the config file)"
    )


Reason = Annotated[str, Meta(max_length=2000, pattern=r"^[^\x00]*$")]
Rate = Annotated[float, Meta(ge=0.0, le=1.0)]
# Copies per second a candidate asks for (adaptive sampling, gateway.mirror.rate); the upper
# bound only keeps nonsense out: no host offers a million requests a second.
MAX_TARGET_RPS = 1_000_000.0
TargetRps = Annotated[
    float,
    Meta(
        gt=0.0,
        le=MAX_TARGET_RPS,
        description="Copies per second wanted from this gateway host; sample_rate is the ceiling",
    ),
]
Items = Annotated[int, Meta(ge=1, le=1_000_000)]
Bytes = Annotated[int, Meta(ge=1, le=1 << 40)]
Concurrency = Annotated[int, Meta(ge=1, le=4096)]
Timeout = Annotated[float, Meta(ge=0.001, le=86_400.0)]
Price = Annotated[float, Meta(ge=0.0, le=1_000_000.0)]
Gpus = Annotated[int, Meta(ge=1, le=4096)]
VerdictKey = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Verdict = Annotated[
    dict[VerdictKey, float],
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
}

MUTABLE_FIELDS = (
    "role",
    "url",
    "kind",
    "sample_rate",
    "target_rps",
    "sampling",
    "buffer_max_items",
    "buffer_max_bytes",
    "concurrency",
    "timeout_s",
    "model",
    "forward_auth",
    "credentials_env",
    "price_per_hour_usd",
    "gpus",
    "state",
    "verdict",
)


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One serving endpoint: the live one, a candidate, or a retired former live one."""

    name: str
    url: str
    role: Role = "candidate"
    kind: str = ""
    model: str | None = None
    sample_rate: float = DEFAULT_SAMPLE_RATE
    # When set, the share mirrored adapts so copies/s approach it; sample_rate is the ceiling.
    target_rps: float | None = None
    sampling: Sampling = "request"
    buffer_max_items: int = DEFAULT_BUFFER_MAX_ITEMS
    buffer_max_bytes: int = DEFAULT_BUFFER_MAX_BYTES
    concurrency: int = DEFAULT_CONCURRENCY
    timeout_s: float = DEFAULT_TIMEOUT_S
    price_per_hour_usd: float | None = None
    gpus: int = 1
    credentials_env: str | None = None
    forward_auth: bool = False
    state: State = "active"
    # Per-candidate overrides of evaluators.judge.settings.VerdictSettings fields (name -> value).
    verdict_overrides: dict[str, float] = msgspec.field(default_factory=dict)
    version: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0


class CandidateSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A candidate as an operator declares it: the body of `POST /admin/candidates` and a
    `[[candidates]]` table of the config file (one type, one set of defaults)."""

    name: Name
    url: Url
    kind: Kind = ""
    sample_rate: Rate = DEFAULT_SAMPLE_RATE
    target_rps: TargetRps | None = None
    sampling: Sampling = "request"
    buffer_max_items: Items = DEFAULT_BUFFER_MAX_ITEMS
    buffer_max_bytes: Bytes = DEFAULT_BUFFER_MAX_BYTES
    concurrency: Concurrency = DEFAULT_CONCURRENCY
    timeout_s: Timeout = DEFAULT_TIMEOUT_S
    model: Model | None = None
    forward_auth: bool = False
    credentials_env: EnvName | None = None
    price_per_hour_usd: Price | None = None
    gpus: Gpus = 1
    state: State = "active"
    verdict: Verdict = msgspec.field(default_factory=dict)

    def endpoint_fields(self) -> dict[str, Any]:
        """The `Endpoint` fields this spec sets (its `verdict` becomes `verdict_overrides`)."""
        out = {f: getattr(self, f) for f in SPEC_FIELDS}
        out["verdict_overrides"] = dict(out.pop("verdict"))
        return out

    def to_endpoint(self) -> Endpoint:
        return Endpoint(role="candidate", **self.endpoint_fields())


class CandidatePatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PATCH /admin/candidates/{name}`: only the fields given change; `null` clears
    a nullable field. The name is not mutable; the role moves between candidate and retired
    only (retired: kept for rollback, not mirrored); promote and rollback change the live one."""

    role: Literal["candidate", "retired"] | UnsetType = UNSET
    url: Url | UnsetType = UNSET
    kind: Kind | UnsetType = UNSET
    sample_rate: Rate | UnsetType = UNSET
    target_rps: TargetRps | UnsetType | None = UNSET
    sampling: Sampling | UnsetType = UNSET
    buffer_max_items: Items | UnsetType = UNSET
    buffer_max_bytes: Bytes | UnsetType = UNSET
    concurrency: Concurrency | UnsetType = UNSET
    timeout_s: Timeout | UnsetType = UNSET
    model: Model | UnsetType | None = UNSET
    forward_auth: bool | UnsetType = UNSET
    credentials_env: EnvName | UnsetType | None = UNSET
    price_per_hour_usd: Price | UnsetType | None = UNSET
    gpus: Gpus | UnsetType = UNSET
    state: State | UnsetType = UNSET
    verdict: Verdict | UnsetType = UNSET

    def changes(self) -> dict[str, Any]:
        """The fields that were given, by name."""
        return {f: v for f in MUTABLE_FIELDS if (v := getattr(self, f)) is not UNSET}


# The fields of a spec that are copied onto an `Endpoint` (all but `verdict`, renamed).
SPEC_FIELDS = tuple(f for f in CandidateSpec.__struct_fields__)
