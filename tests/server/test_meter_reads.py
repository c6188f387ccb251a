"""The meter's fast path for reads of whole events gives what its line parser gives, exactly."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.server.meter import MeterResult, ResponseMeter

TEXTS = st.sampled_from(["", "Hel", "lo", "[DONE]", "a\nb", "é", '"}'])


def _event(kind: str, text: str) -> bytes:
    if kind == "done":
        return b"data: [DONE]\n\n"
    if kind == "comment":
        return b": keep-alive\n\n"
    if kind == "garbage":
        return b"data: {not json\n\n"
    if kind == "empty":
        return b"data: \n\n"
    if kind == "multi":  # one event over two data lines: the line parser's case
        return b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"m"}}]}\n\n'
    if kind == "id":
        return b"id: 7\n" + _event("content", text)
    if kind == "usage":
        body: dict[str, object] = {"choices": [], "usage": {"prompt_tokens": 5}}
    else:
        delta: dict[str, object] = {"content": text}
        if kind == "tool":
            delta = {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": text}}]}
        finish = "stop" if kind == "finish" else None
        body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


KINDS = ["content"] * 6 + ["finish", "done", "comment", "garbage", "empty", "multi", "id", "usage",
                           "tool"]  # fmt: skip


def _by_reads(stream: bytes, bounds: list[int], *, byte_by_byte: bool) -> MeterResult:
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=16)
    now = 0.0
    for a, b in itertools.pairwise(bounds):
        now += 0.25
        if byte_by_byte:  # every piece of one read at the read's time: the line parser only
            for i in range(a, b):
                meter.feed(stream[i : i + 1], now)
        else:
            meter.feed(stream[a:b], now)
    return meter.finish(now + 1.0, 200)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.tuples(st.sampled_from(KINDS), TEXTS), max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=6),
)
def test_whole_reads_meter_as_the_line_parser_does(
    events: list[tuple[str, str]], cuts: list[int]
) -> None:
    """TTFT, gaps, token events, text, hash, finish reason, usage, tools and errors are the same
    whether a read goes through the fast path or byte by byte through the line parser."""
    stream = b"".join(_event(kind, text) for kind, text in events)
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    assert _by_reads(stream, bounds, byte_by_byte=False) == _by_reads(
        stream, bounds, byte_by_byte=True
    )
