"""Turn a metered response into the records storage keeps (pure: no IO).

One function for both arms so production and candidate observations are built the same way:
the meter's measured fields carried over as they are (`domain.observation.measured`), output
text kept by `domain.observation.kept_text` (cut to `store_text_max_chars`, or None when
`store_text` is false), the hash of the full text always kept, tool calls as JSON text, and
an `error_kind` derived from the response when the transport itself did not fail.

A stream that carried its final event (`[DONE]`, or choice 0's `finish_reason`) answered: what
the client's socket did afterwards (the SDK closing after `[DONE]` before the gateway's last
write) does not make it a failure. This module must
never do IO or look at anything but the meter's result.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from domain.observation import kept_text, measured
from domain.outcomes import ErrorKind
from domain.records import ObservationRecord
from gateway.server.meter import MeterResult

__all__ = ["classify", "observation"]

_encode: Final = msgspec.json.Encoder().encode


def classify(result: MeterResult) -> ErrorKind | None:
    """The error kind a complete exchange's response shows, or None when it looks healthy."""
    if result.status >= 500:
        return ErrorKind.HTTP_5XX
    if result.status >= 400:
        return ErrorKind.HTTP_4XX
    if result.status < 200:
        return ErrorKind.HTTP_OTHER
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
    fields = measured(result)
    fields.update(queue_wait_s=queue_wait_s, text_truncated=truncated, error_kind=error_kind)
    tools = result.tool_calls
    return ObservationRecord(
        **fields,
        exchange_id=exchange_id,
        endpoint=endpoint,
        arm=arm,
        started_at=started_at,
        output_text=text,
        tool_calls=(
            None
            if tools is None
            else _encode([{"name": n, "arguments": a} for n, a in tools]).decode()
        ),
    )
