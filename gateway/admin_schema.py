"""The admin API's wire types, and the pure conversions of storage records into them.

Request bodies are msgspec Structs with `forbid_unknown_fields`, so one decode validates types,
bounds and patterns, and an unknown field (say, a raw `api_key`) is a 422 instead of being
stored. The bounds are also what keeps storage honest: 32-bit integer columns, no NUL bytes in
text (PostgreSQL refuses them), no credentials inside a URL. Response Structs are what handlers
encode and what `gateway.admin_client` decodes; `gateway.admin_openapi` generates the OpenAPI
document from all of them. Nothing here does IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from gateway.config import NAME_PATTERN, MiB
from storage.records import Endpoint, PromotionRecord

Name = Annotated[str, Meta(pattern=NAME_PATTERN, description="Endpoint name: " + NAME_PATTERN)]
# http(s), a host without userinfo (credentials never travel inside a URL): a name, or an IPv6
# literal in brackets; an optional port in 0..65535, then anything printable. Precise enough
# that every string it admits passes config.check_http_url, which the handler runs as well.
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
URL_PATTERN = rf"^https?://(\[({_IPV6})\]|[A-Za-z0-9._~-]+)(:{_PORT})?([/?#][^\s\x00-\x1f\x7f]*)?$"
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
Reason = Annotated[str, Meta(max_length=2000, pattern=r"^[^\x00]*$")]
Rate = Annotated[float, Meta(ge=0.0, le=1.0)]
Items = Annotated[int, Meta(ge=1, le=1_000_000)]
Bytes = Annotated[int, Meta(ge=1, le=1 << 40)]
Concurrency = Annotated[int, Meta(ge=1, le=4096)]
Timeout = Annotated[float, Meta(ge=0.001, le=86_400.0)]
Price = Annotated[float, Meta(ge=0.0, le=1_000_000.0)]
Gpus = Annotated[int, Meta(ge=1, le=4096)]
VerdictKey = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Verdict = Annotated[
    dict[VerdictKey, float],
    Meta(description="Overrides of evaluators.settings.VerdictSettings fields, by name"),
]
Sampling = Literal["request", "session"]
State = Literal["active", "paused"]
VerdictValue = Literal["promote", "hold", "reject"]

# What a failed pattern means, by field: msgspec's message would quote the regex.
PATTERN_REASONS = {
    "name": f"must match {NAME_PATTERN} (lowercase letters, digits, - and _)",
    "url": "must be an absolute http(s) URL with a host, a port in 0..65535 and no "
    "user:password@ (use credentials_env for credentials)",
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


class CandidateCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/candidates`. Defaults are those of a `[[candidates]]` table."""

    name: Name
    url: Url
    kind: Kind = ""
    sample_rate: Rate = 0.1
    sampling: Sampling = "request"
    buffer_max_items: Items = 1024
    buffer_max_bytes: Bytes = 64 * MiB
    concurrency: Concurrency = 4
    timeout_s: Timeout = 300.0
    model: Model | None = None
    forward_auth: bool = False
    credentials_env: EnvName | None = None
    price_per_hour_usd: Price | None = None
    gpus: Gpus = 1
    state: State = "active"
    verdict: Verdict = msgspec.field(default_factory=dict)


class CandidatePatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PATCH /admin/candidates/{name}`: only the fields given change; `null` clears
    a nullable field. The name is not mutable; the role moves between candidate and retired
    only (retired: kept for rollback, not mirrored); promote and rollback change the live one."""

    role: Literal["candidate", "retired"] | UnsetType = UNSET
    url: Url | UnsetType = UNSET
    kind: Kind | UnsetType = UNSET
    sample_rate: Rate | UnsetType = UNSET
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


class PromoteRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/candidates/{name}/promote` (optional)."""

    reason: Reason = ""
    force: bool = False


class RollbackRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/rollback` (optional)."""

    reason: Reason = ""


class EndpointView(msgspec.Struct, kw_only=True):
    """An endpoint as the API returns it: configuration, role and version; never a secret."""

    name: str
    url: str
    role: Literal["live", "candidate", "retired"]
    kind: str
    model: str | None
    sample_rate: float
    sampling: Sampling
    buffer_max_items: int
    buffer_max_bytes: int
    concurrency: int
    timeout_s: float
    price_per_hour_usd: float | None
    gpus: int
    credentials_env: str | None
    forward_auth: bool
    state: State
    verdict: dict[str, float]
    version: int
    created_at: float
    updated_at: float


class Counters(msgspec.Struct, kw_only=True):
    """This replica's copy accounting for one candidate (DESIGN.md §3.4):
    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload + sent + pending
    and sent = observed_ok + observed_error + timed_out."""

    sampled: int = 0
    deduplicated: int = 0
    dropped_overflow: int = 0
    dropped_oversize: int = 0
    shed_overload: int = 0
    sent: int = 0
    pending: int = 0
    observed_ok: int = 0
    observed_error: int = 0
    timed_out: int = 0
    dropped_on_stop: int = 0  # included in dropped_overflow


class BufferFill(msgspec.Struct, kw_only=True):
    """How full this replica's ring buffer for the candidate is."""

    items: int
    max_items: int
    bytes: int
    max_bytes: int
    fill_ratio: float  # the larger of items/max_items and bytes/max_bytes


class CandidateDetail(EndpointView, kw_only=True):
    """`GET /admin/candidates/{name}`: the endpoint plus live counters and buffer fill."""

    counters: Counters
    buffer: BufferFill


class CandidateList(msgspec.Struct, kw_only=True):
    """`GET /admin/candidates`: every endpoint that is not live (candidates and retired)."""

    registry_version: int
    candidates: list[EndpointView]


class PromotionView(msgspec.Struct, kw_only=True):
    """An audit row of `promotions` (without the report snapshot)."""

    id: int
    action: Literal["promote", "rollback"]
    from_endpoint: str | None
    to_endpoint: str
    actor: str
    reason: str
    forced: bool
    verdict: str | None
    at: float


class PromotionResult(msgspec.Struct, kw_only=True):
    """Answer to a promote or a rollback: the audit row and the endpoint now live."""

    promotion: PromotionView
    live: EndpointView


class StatusView(msgspec.Struct, kw_only=True):
    """`GET /admin/status`: this replica's view of the registry, mirror and writer. It answers
    during a storage outage too, from the last loaded registry, with `storage_ok` false."""

    storage_ok: bool
    registry_version: int
    live: EndpointView
    candidates: list[CandidateDetail]
    writer: dict[str, int]
    last_promotion: PromotionView | None


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    message: str
    type: str
    code: int
    field: str | None = None  # set on 422: the offending body field (dotted path)
    detail: dict[str, Any] | None = None  # e.g. a refused promote: verdict and reasons


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every error the admin API returns, whatever the status."""

    error: ErrorInfo


# --- records -> views (pure) ----------------------------------------------------------------


def view(ep: Endpoint) -> EndpointView:
    """The endpoint as the API shows it (`verdict_overrides` is called `verdict` on the wire)."""
    fields = msgspec.structs.asdict(ep)
    fields["verdict"] = fields.pop("verdict_overrides")
    return EndpointView(**fields)


def detail(ep: Endpoint, counters: Mapping[str, int]) -> CandidateDetail:
    """The endpoint plus this replica's counters (unknown names ignored) and buffer fill."""
    known = {f: counters[f] for f in Counters.__struct_fields__ if f in counters}
    items, size = counters.get("buffer_items", 0), counters.get("buffer_bytes", 0)
    fill = max(items / ep.buffer_max_items, size / ep.buffer_max_bytes)
    buffer = BufferFill(
        items=items,
        max_items=ep.buffer_max_items,
        bytes=size,
        max_bytes=ep.buffer_max_bytes,
        fill_ratio=round(fill, 4),
    )
    return CandidateDetail(
        **msgspec.structs.asdict(view(ep)), counters=Counters(**known), buffer=buffer
    )


def promotion_view(rec: PromotionRecord) -> PromotionView:
    """An audit row without its report snapshot."""
    fields = msgspec.structs.asdict(rec)
    del fields["report_snapshot"]
    return PromotionView(**fields)
