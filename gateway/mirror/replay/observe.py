"""Turn a metered response into the records storage keeps (pure: no IO).

One function for both arms so production and candidate observations are built the same way:
the meter's measured fields carried over as they are (every name in `MEASURED`), output
text kept by `domain.observation.kept_text` (cut to `store_text_max_chars`, or None when
`store_text` is false), the hash of the full text always kept, tool calls as JSON text
(`[{"name", "arguments", "id"}]`, the id absent when the answer gave none), and an
`error_kind` derived from the response when the transport itself did not fail.

A stream that carried its final event (`[DONE]`, or choice 0's `finish_reason`) answered: what
the client's socket did afterwards (the SDK closing after `[DONE]` before the gateway's last
write) does not make it a failure. This module must
never do IO or look at anything but the meter's result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import msgspec

from domain.observation import MEASURED, kept_text
from domain.outcomes import ErrorKind
from domain.records import ObservationRecord
from gateway.server.meter import MeterResult

__all__ = ["classify", "observation"]

_encode: Final = msgspec.json.Encoder().encode

# Set by `observation` itself, not carried from the meter's result.
_OWN: Final = ("queue_wait_s", "text_truncated", "error_kind")


def _builder() -> Callable[..., ObservationRecord]:
    """`ObservationRecord(ttft_s=r.ttft_s, …)` with every measured field written out: the
    keywords are known when the function is compiled, where `ObservationRecord(**fields)`
    builds and unpacks a dict of them per observation (twice the cost, on every copy's path).
    Generated from the declaration (`MEASURED`, struct field names), so a field added there is
    carried here without a change; tests/test_observation.py checks every one arrives."""
    carried = "".join(f"{name}=r.{name}, " for name in MEASURED if name not in _OWN)
    source = (
        "def build(r, exchange_id, endpoint, arm, started_at, output_text, tool_calls,"
        " queue_wait_s, text_truncated, error_kind):\n"
        f"    return Record({carried}queue_wait_s=queue_wait_s, text_truncated=text_truncated,"
        " error_kind=error_kind, exchange_id=exchange_id, endpoint=endpoint, arm=arm,"
        " started_at=started_at, output_text=output_text, tool_calls=tool_calls)\n"
    )
    scope: dict[str, object] = {"Record": ObservationRecord}
    exec(compile(source, "<observation builder>", "exec"), scope)  # names from MEASURED only
    build = scope["build"]
    assert callable(build)
    return build


_build: Final = _builder()


def _call(name: str, arguments: str, call_id: str | None) -> dict[str, str]:
    """A stored tool call: name, arguments as emitted and the call id (absent when none came)."""
    if call_id is None:
        return {"name": name, "arguments": arguments}
    return {"name": name, "arguments": arguments, "id": call_id}


def classify(result: MeterResult) -> ErrorKind | None:
    """The error kind a complete exchange's response shows, or None when it looks healthy."""
    if result.status >= 500:
        return ErrorKind.HTTP_5XX
    if result.status >= 400:
        return ErrorKind.HTTP_4XX
    if result.status < 200:
        return ErrorKind.HTTP_OTHER
    if result.finish_reason == "error":  # a Responses answer that failed (`response.failed`)
        return ErrorKind.OTHER
    if result.is_sse:
        if result.saw_done or result.finish_reason is not None:
            return None
        if result.parse_errors or (result.bytes_total and not result.chunk_count):
            return ErrorKind.GARBAGE
        return ErrorKind.TRUNCATED
    return ErrorKind.GARBAGE if result.parse_errors else None


def observation(
    exchange_id: str,
    endpoint: str,
    arm: Literal["production", "candidate"],
    started_at: float,
    result: MeterResult,
    error_kind: str | None,
    *,
    store_text: bool,
    max_chars: int,
    queue_wait_s: float | None = None,
) -> ObservationRecord:
    """An `ObservationRecord` for one arm of one exchange.

    `error_kind` None means the transport did not fail; the response itself is then classified
    here, so production and candidates are judged by the same rule.
    """
    if error_kind is None:
        error_kind = classify(result)
    text, truncated = kept_text(
        result.text, result.text_truncated, store_text=store_text, max_chars=max_chars
    )
    tools = result.tool_calls
    return _build(
        result,
        exchange_id,
        endpoint,
        arm,
        started_at,
        text,
        None if tools is None else _encode([_call(*t) for t in tools]).decode(),
        queue_wait_s,
        truncated,
        error_kind,
    )
