"""Unit tests of the pure, incremental response meter (gateway/server/meter.py)."""

from __future__ import annotations

import json

import pytest
import xxhash

from gateway.server.meter import MeterResult, ResponseMeter


def chat_event(content: str | None = None, finish: str | None = None, **extra: object) -> bytes:
    delta: dict[str, object] = {}
    if content is not None:
        delta["content"] = content
    delta.update(extra)
    body = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


USAGE_EVENT = (
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
    b'"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
)

STREAM = (
    chat_event("", role="assistant")
    + chat_event("Hel")
    + chat_event("lo")
    + chat_event(" you", finish="stop")
    + USAGE_EVENT
    + b"data: [DONE]\n\n"
)


def run(chunks: list[bytes], *, is_sse: bool = True, text_max: int = 1000) -> MeterResult:
    meter = ResponseMeter(0.0, is_sse=is_sse, text_max_chars=text_max)
    for i, chunk in enumerate(chunks):
        meter.feed(chunk, float(i + 1))
    return meter.finish(float(len(chunks) + 1), 200)


def test_whole_stream_in_one_chunk() -> None:
    """A complete chat stream in one chunk yields text, usage, finish reason and [DONE]."""
    res = run([STREAM])
    assert res.text == "Hello you"
    assert res.finish_reason == "stop"
    assert res.saw_done
    assert res.chunk_count == 6
    assert res.token_chunk_count == 3
    # The engine's count is information; tokens are counted from the text in the mirror plane.
    assert res.usage_tokens == 3 and res.token_events == 3 and res.output_tokens is None
    assert res.prompt_tokens == 7 and res.cached_tokens == 4
    assert res.parse_errors == 0
    assert res.output_hash == xxhash.xxh3_128_hexdigest(b"Hello you")
    assert res.bytes_total == len(STREAM)


@pytest.mark.parametrize("split", range(1, len(STREAM)))
def test_every_split_point_gives_the_same_result(split: int) -> None:
    """Splitting the stream at any byte boundary changes nothing but timings."""
    whole = run([STREAM])
    parts = run([STREAM[:split], STREAM[split:]])
    for field in ("text", "finish_reason", "saw_done", "chunk_count", "token_chunk_count"):
        assert getattr(parts, field) == getattr(whole, field), field
    assert parts.usage_tokens == 3 and parts.parse_errors == 0


def test_byte_by_byte_feed() -> None:
    """Feeding one byte at a time parses every event exactly once."""
    res = run([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert res.text == "Hello you" and res.chunk_count == 6 and res.saw_done


def test_timings_follow_token_chunks() -> None:
    """TTFT is the first token-bearing event; ITL, E2E and TPOT follow docs/design.md, "The
    request path"."""
    chunks = [
        chat_event("", role="assistant"),  # t=1, no token
        chat_event("a"),  # t=2 -> TTFT
        chat_event("b"),  # t=3
        chat_event("c"),  # t=4
        chat_event(None, finish="stop"),  # t=5, no token
        b"data: [DONE]\n\n",  # t=6
    ]
    res = run(chunks)
    assert res.ttft_s == 2.0
    assert res.e2e_s == 4.0
    assert res.last_byte_s == 6.0
    assert res.inter_event_count == 2 and res.inter_event_mean_s == 1.0
    assert res.inter_event_max_s == 1.0
    assert res.inter_event_p50_s == 1.0 and res.inter_event_p99_s == 1.0
    assert res.token_events == 3 and res.usage_tokens is None
    assert res.output_tokens is None and res.tpot_s is None  # counted later, from the text


def test_percentiles_interpolate() -> None:
    """ITL p50/p99 interpolate linearly between ranks, as numpy does."""
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=10)
    t = 0.0
    for gap in (0.0, 1.0, 2.0, 3.0, 4.0):
        t += gap
        meter.feed(chat_event("x"), t)
    res = meter.finish(t, 200)
    assert res.inter_event_count == 4
    assert res.inter_event_p50_s == pytest.approx(2.5)
    assert res.inter_event_p99_s == pytest.approx(3.97)


def test_multi_line_data_comments_and_other_fields() -> None:
    """Multi-line `data:` joins with newlines; comments, event/id/retry fields are ignored."""
    stream = (
        b": keep-alive comment\n"
        b"event: message\n"
        b"id: 1\n"
        b'data: {"choices":[{"index":0,\n'
        b'data: "delta":{"content":"hi"}}]}\n'
        b"retry: 100\n"
        b"\n"
        b":another comment\n\n"
        b"data:[DONE]\n\n"
    )
    res = run([stream])
    assert res.text == "hi"
    assert res.chunk_count == 2
    assert res.saw_done and res.parse_errors == 0


def test_crlf_and_cr_line_endings_even_when_split() -> None:
    """CRLF and lone CR line endings work, including a CRLF split across two chunks."""
    stream = chat_event("a").replace(b"\n", b"\r\n") + chat_event("b").replace(b"\n", b"\r")
    cut = stream.index(b"\r\n") + 1
    res = run([stream[:cut], stream[cut:]])
    assert res.text == "ab" and res.chunk_count == 2 and res.parse_errors == 0


def test_garbage_counts_parse_errors() -> None:
    """Non-JSON data and non-SSE lines are counted as parse errors, never raised."""
    res = run([b"data: {not json\n\n", b"\x00\xff random bytes\n", b"data: [1, 2]\n\n"])
    assert res.parse_errors == 3
    assert res.text == "" and res.ttft_s is None and res.output_hash is None


def test_overlong_line_is_dropped() -> None:
    """A line longer than the bound without a newline is dropped and counted."""
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=10)
    meter.feed(b"data: " + b"x" * (2 << 20), 1.0)
    meter.feed(b"\n\n" + chat_event("ok"), 2.0)
    res = meter.finish(3.0, 200)
    assert res.parse_errors == 1
    assert res.text == "ok"


def test_text_truncation_keeps_full_hash() -> None:
    """Text is kept up to the limit while the hash covers all of it."""
    pieces = ["abc", "defg", "hij", "klmnop"]
    res = run([chat_event(p) for p in pieces], text_max=5)
    assert res.text == "abcde" and res.text_truncated
    assert res.output_hash == xxhash.xxh3_128_hexdigest("".join(pieces).encode())


def test_zero_text_limit_still_hashes() -> None:
    """With a text limit of 0 nothing is kept, and the hash is still of the full text."""
    res = run([chat_event("héllo"), chat_event(" wörld")], text_max=0)
    assert res.text == "" and res.text_truncated
    assert res.output_hash == xxhash.xxh3_128_hexdigest("héllo wörld".encode())


def test_tool_call_fragments_are_joined_per_index() -> None:
    """Streamed tool calls collect the name and the concatenated argument fragments per index."""

    res = run(
        [
            tool_delta(0, "get_weather", "", "call_a"),
            tool_delta(0, None, '{"city": '),
            tool_delta(1, "get_time", '{"tz"', "call_b"),
            tool_delta(0, None, '"Paris"}'),
            tool_delta(1, None, ': "UTC"}'),
            chat_event(None, finish="tool_calls"),
        ]
    )
    assert res.tool_calls == [
        ("get_weather", '{"city": "Paris"}', "call_a"),
        ("get_time", '{"tz": "UTC"}', "call_b"),
    ]
    assert res.finish_reason == "tool_calls"
    assert res.token_chunk_count == 5


def tool_delta(index: int, name: str | None, args: str, call_id: str | None = None) -> bytes:
    """A chat delta with one tool-call fragment; the id only on a call's first, as vLLM sends."""
    fn: dict[str, str] = {"arguments": args}
    if name:
        fn["name"] = name
    call: dict[str, object] = {"index": index, "function": fn}
    if call_id is not None:
        call.update(id=call_id, type="function")
    return chat_event(None, tool_calls=[call])


def test_parallel_chat_calls_keep_distinct_ids_and_a_call_without_id_gets_none() -> None:
    """Parallel streamed calls keep each call's own id, in index order, whatever order their
    fragments come in; a call whose deltas never carried an id is reported with None."""
    res = run(
        [
            tool_delta(1, "b", "{", "call_2")
            + tool_delta(0, "a", "{", "call_1")
            + tool_delta(2, "c", "{}"),
            tool_delta(0, None, "}") + tool_delta(1, None, "}"),
            chat_event(None, finish="tool_calls"),
        ]
    )
    assert res.tool_calls == [("a", "{}", "call_1"), ("b", "{}", "call_2"), ("c", "{}", None)]


def test_completions_stream_text_field() -> None:
    """/v1/completions streams carry `text` instead of `delta.content`."""
    event = b'data: {"choices":[{"index":0,"text":"foo","finish_reason":null}]}\n\n'
    res = run([event, event.replace(b"foo", b"bar"), b"data: [DONE]\n\n"])
    assert res.text == "foobar" and res.token_chunk_count == 2


def test_non_sse_chat_json_split_in_chunks() -> None:
    """A plain JSON chat answer, split arbitrarily, gives text, usage and timings."""
    body = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Bonjour"},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9},
        }
    ).encode()
    res = run([body[:10], body[10:30], body[30:]], is_sse=False)
    assert res.text == "Bonjour" and res.finish_reason == "length"
    assert res.usage_tokens == 9 and res.prompt_tokens == 5
    assert res.ttft_s == 1.0 and res.e2e_s == 3.0 and res.last_byte_s == 3.0
    assert res.chunk_count == 3 and res.parse_errors == 0
    # A plain JSON answer has no token events and no TPOT: its tokens came in one body.
    assert res.token_events is None and res.tpot_s is None


def test_non_sse_tool_calls_and_embeddings() -> None:
    """Whole-response tool calls are read; an embeddings answer has usage but no tokens."""
    chat = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "content": None,
                        "tool_calls": [
                            {"id": "call_9", "function": {"name": "f", "arguments": "{}"}},
                            {"function": {"name": "g", "arguments": "[]"}},
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        }
    ).encode()
    assert run([chat], is_sse=False).tool_calls == [("f", "{}", "call_9"), ("g", "[]", None)]
    emb = json.dumps({"data": [{"embedding": [0.1] * 50}], "usage": {"prompt_tokens": 3}})
    res = run([emb.encode()], is_sse=False)
    assert res.ttft_s is None and res.e2e_s == 1.0 and res.prompt_tokens == 3
    assert res.output_hash is None and res.usage_tokens is None


def test_non_json_body_and_oversized_body() -> None:
    """A non-JSON plain body counts one parse error; one over the bound is not parsed at all."""
    assert run([b"<html>oops</html>"], is_sse=False).parse_errors == 1
    meter = ResponseMeter(0.0, is_sse=False, text_max_chars=10, json_max_bytes=8)
    meter.feed(b'{"choices": []}', 1.0)
    res = meter.finish(2.0, 200)
    assert res.parse_errors == 0 and res.bytes_total == 15


def test_empty_response() -> None:
    """A response without a body still finishes with its status and no timings."""
    res = ResponseMeter(0.0, is_sse=False, text_max_chars=10).finish(1.0, 204)
    assert res.status == 204 and res.ttft_s is None and res.e2e_s is None
    assert res.bytes_total == 0 and res.chunk_count == 0
