"""The stream watch (gateway/server/stream/watch.py) answers as the full meter does, read after
read."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.server.meter import ResponseMeter
from gateway.server.stream.watch import StreamWatch

# Texts that look like the markers the watch searches for, inside JSON strings (capital Ds:
# the watch finds `[DONE]` by memchr for its D, a text of many hands over to a substring search).
TEXTS = st.sampled_from(
    ["", "Hel", "lo", '"finish_reason":"stop"', "[DONE]", "a\nb", '\\"finish_reason\\"', "é",
     "D", "[D", "DDDDDDDDDDDD[DONE]", "DONE] [DON"]
)  # fmt: skip


def _event(kind: str, text: str, compact: bool) -> bytes:
    seps = (",", ":") if compact else (", ", ": ")
    choice: dict[str, object] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    if kind == "role":
        choice["delta"] = {"role": "assistant", "content": ""}
    elif kind == "finish":
        choice["finish_reason"] = "stop"
    elif kind == "finish_other":  # another choice's end is not the stream's
        choice = {"index": 1, "delta": {"content": text}, "finish_reason": "length"}
    elif kind == "usage":
        return b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 3}}).encode()
    elif kind == "done":
        return b"data: [DONE]"
    elif kind == "comment":
        return b": keep-alive"
    elif kind == "garbage":
        return b"data: {not json"
    body = {"id": "c1", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + json.dumps(body, separators=seps).encode()


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            ["role", "content", "content", "content", "finish", "finish_other", "usage", "done",
             "comment", "garbage"]
        ),
        TEXTS,
    ),
    max_size=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    events=EVENTS,
    compact=st.booleans(),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_watch_agrees_with_the_meter_after_every_read(
    events: list[tuple[str, str]], compact: bool, crlf: bool, cuts: list[int]
) -> None:
    """First token time and final event agree with a full meter's, whatever the events, their
    spelling, line endings and read boundaries."""
    eol = b"\r\n" if crlf else b"\n"
    stream = b"".join(_event(kind, text, compact) + eol + eol for kind, text in events)
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=100)
    watch = StreamWatch(0.0)
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        now = float(i + 1)
        meter.feed(stream[a:b], now)
        watch.feed(stream[a:b], now)
        assert watch.first_token_at == meter.first_token_at
        assert watch.final_event_seen() == meter.final_event_seen()


def test_after_the_first_token_only_reads_with_an_end_are_metered() -> None:
    """Past the first token a read of content events is not parsed, and the final event is
    still seen when it comes, in a read of its own or split across two."""
    content = _event("content", "x", True) + b"\n\n"
    watch = StreamWatch(0.0)
    watch.feed(_event("role", "", True) + b"\n\n" + content, 1.0)
    assert watch.first_token_at == 1.0
    watch.feed(content * 50, 2.0)
    assert watch._meter.chunk_count == 2  # the 50 events of the second read were not parsed
    assert not watch.final_event_seen()
    final = _event("finish", "", True) + b"\n\n"
    watch.feed(content + final[:30], 3.0)
    assert not watch.final_event_seen()
    watch.feed(final[30:], 4.0)
    assert watch.final_event_seen()
    assert watch.first_token_at == 1.0


def test_done_among_many_capital_ds_is_found() -> None:
    """A read whose `[DONE]` comes after more capital Ds than the watch looks at one by one,
    and is not the read's last event (a comment follows it), is still the final event."""
    watch = StreamWatch(0.0)
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=100)
    first = _event("role", "", True) + b"\n\n" + _event("content", "x", True) + b"\n\n"
    rest = b"".join(
        [_event("content", "D" * 20, True) + b"\n\n", b"data: [DONE]\n\n", b": bye\n\n"]
    )
    for i, read in enumerate((first, rest)):
        watch.feed(read, float(i))
        meter.feed(read, float(i))
    assert meter.final_event_seen() and watch.final_event_seen()
