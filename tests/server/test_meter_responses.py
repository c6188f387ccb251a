"""Unit tests of the meter on the Responses API (`/v1/responses`), streamed and whole: events
written as vLLM's Responses server writes them (`event: <type>`, then `data: <json>`, and no
`[DONE]`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xxhash

from gateway.server.meter import MeterResult, ResponseMeter
from gateway.server.stream.watch import StreamWatch


def event(kind: str, **fields: Any) -> bytes:
    """One SSE event as vLLM frames it: its type on the `event:` line and in the data."""
    data = json.dumps({**fields, "sequence_number": 0, "type": kind}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def response_obj(status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "status": status,
        "output": output,
        "usage": {
            "input_tokens": 11,
            "input_tokens_details": {"cached_tokens": 8},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 16,
        },
        **extra,
    }


def message(text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def call_item(index: int, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{index}",
        "call_id": f"call_{index}",
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def text_stream(pieces: list[str]) -> list[bytes]:
    text = "".join(pieces)
    head = message("")
    head.update(status="in_progress", content=[])
    events = [
        event("response.created", response=response_obj("in_progress", [], usage=None)),
        event("response.in_progress", response=response_obj("in_progress", [], usage=None)),
        event("response.output_item.added", output_index=0, item=head),
        event(
            "response.content_part.added", output_index=0, item_id="msg_1", content_index=0,
            part={"type": "output_text", "text": "", "annotations": []},
        ),
    ]  # fmt: skip
    events += [
        event(
            "response.output_text.delta", content_index=0, delta=piece, item_id="msg_1",
            logprobs=[], output_index=0,
        )
        for piece in pieces
    ]  # fmt: skip
    events += [
        event("response.output_text.done", output_index=0, item_id="msg_1", text=text),
        event("response.output_item.done", output_index=0, item=message(text)),
        event("response.completed", response=response_obj("completed", [message(text)])),
    ]
    return events


def call_stream(calls: list[tuple[str, list[str]]]) -> list[bytes]:
    """Function calls one after another, each announced, its arguments in the given deltas."""
    events = [event("response.created", response=response_obj("in_progress", [], usage=None))]
    items = []
    for index, (name, deltas) in enumerate(calls):
        args = "".join(deltas)
        events.append(
            event(
                "response.output_item.added", output_index=index,
                item=call_item(index, name, "", "in_progress"),
            )
        )  # fmt: skip
        events += [
            event(
                "response.function_call_arguments.delta", item_id=f"fc_{index}", delta=delta,
                output_index=index,
            )
            for delta in deltas
        ]  # fmt: skip
        events += [
            event(
                "response.function_call_arguments.done", arguments=args, item_id=f"fc_{index}",
                name=name, output_index=index,
            ),
            event(
                "response.output_item.done", output_index=index,
                item=call_item(index, name, args),
            ),
        ]  # fmt: skip
        items.append(call_item(index, name, args))
    events.append(event("response.completed", response=response_obj("completed", items)))
    return events


def run(chunks: list[bytes], *, is_sse: bool = True, text_max: int = 1000) -> MeterResult:
    meter = ResponseMeter(0.0, is_sse=is_sse, text_max_chars=text_max)
    for i, chunk in enumerate(chunks):
        meter.feed(chunk, float(i + 1))
    return meter.finish(float(len(chunks) + 1), 200)


def test_text_stream_gives_ttft_text_gaps_usage_and_stop() -> None:
    """The first output-text delta is the TTFT, each delta a token event, `response.completed`
    ends the stream with the usage and "stop"; the events before the first delta do not count."""
    events = text_stream(["Hel", "lo", " you"])
    res = run(events)
    assert res.ttft_s == 5.0  # created, in_progress, item added, part added, then the delta
    assert res.text == "Hello you" and res.output_hash == xxhash.xxh3_128_hexdigest(b"Hello you")
    assert res.token_events == 3 and res.inter_event_count == 2 and res.inter_event_mean_s == 1.0
    assert res.finish_reason == "stop" and res.finished and not res.saw_done
    assert res.prompt_tokens == 11 and res.cached_tokens == 8 and res.usage_tokens == 5
    assert res.chunk_count == len(events) and res.parse_errors == 0 and res.tool_calls is None


def test_every_split_point_gives_the_same_result() -> None:
    """Any cut of a Responses stream into two reads meters the same text, calls and usage."""
    whole = b"".join(text_stream(["a", "b"]) + call_stream([("f", ['{"x"', ":1}"])])[1:])
    expected = run([whole])
    for cut in range(1, len(whole), 7):
        res = run([whole[:cut], whole[cut:]])
        assert (res.text, res.tool_calls, res.finish_reason, res.prompt_tokens) == (
            expected.text, expected.tool_calls, expected.finish_reason, expected.prompt_tokens,
        )  # fmt: skip
        assert res.token_chunk_count == expected.token_chunk_count == 4


def test_function_call_split_across_many_deltas_is_reassembled_with_its_call_id() -> None:
    """A call's arguments in many deltas are joined, named and tied to its call_id; the finish
    reason is "tool_calls" and each argument delta is a token event."""
    args = '{"city": "Paris", "unit": "celsius"}'
    deltas = [args[i : i + 3] for i in range(0, len(args), 3)]
    res = run(call_stream([("get_weather", deltas)]))
    assert res.tool_calls == [("get_weather", args, "call_0")]
    assert res.finish_reason == "tool_calls" and res.token_events == len(deltas)
    assert res.text == ""


def test_parallel_function_calls_keep_their_order_and_ids() -> None:
    """Two calls (even with interleaved deltas) come out in output order with distinct ids."""
    events = call_stream([("a", ['{"x"', ": 1}"]), ("b", ["{}"])])
    # Move call b's announcement and delta before call a's last delta: deltas keyed by index.
    b_added = next(e for e in events if b'"output_index":1' in e and b"item.added" in e)
    events.remove(b_added)
    events.insert(2, b_added)
    res = run(events)
    assert res.tool_calls == [("a", '{"x": 1}', "call_0"), ("b", "{}", "call_1")]


def test_deltas_without_output_index_find_their_call_by_item_id() -> None:
    """An engine that sends only `item_id` on argument deltas still has them joined right."""
    events = [
        event("response.output_item.added", output_index=0, item=call_item(0, "a", "", "x")),
        event("response.output_item.added", output_index=1, item=call_item(1, "b", "", "x")),
        event("response.function_call_arguments.delta", item_id="fc_1", delta="[2]"),
        event("response.function_call_arguments.delta", item_id="fc_0", delta="[1]"),
        event("response.completed", response=response_obj("completed", [])),
    ]
    res = run(events)
    assert res.tool_calls == [("a", "[1]", "call_0"), ("b", "[2]", "call_1")]


def test_reasoning_delta_is_the_first_token_but_not_the_text() -> None:
    """A reasoning delta starts the TTFT and counts as a token event; the text is the answer's."""
    reasoning = event(
        "response.reasoning_text.delta", content_index=0, delta="think", item_id="rs_1",
        output_index=0,
    )  # fmt: skip
    events = text_stream(["ok"])
    events.insert(2, reasoning)
    res = run(events)
    assert res.ttft_s == 3.0 and res.text == "ok" and res.token_events == 2


@pytest.mark.parametrize(
    ("status", "details", "reason"),
    [
        ("incomplete", {"reason": "max_output_tokens"}, "length"),
        ("incomplete", None, "length"),
        ("incomplete", {"reason": "content_filter"}, "content_filter"),
        ("failed", None, "error"),
    ],
)
def test_terminal_status_maps_to_a_finish_reason(
    status: str, details: dict[str, str] | None, reason: str
) -> None:
    """`response.incomplete` / `response.failed` end the stream with the mapped finish reason."""
    events = text_stream(["a"])
    obj = response_obj(status, [message("a")], incomplete_details=details)
    events[-1] = event(f"response.{status}", response=obj)
    res = run(events)
    assert res.finish_reason == reason and res.finished


def test_stream_cut_before_its_terminal_event_is_not_finished() -> None:
    """Without `response.completed` the stream has no finish reason and did not finish."""
    res = run(text_stream(["a", "b"])[:-1])
    assert res.finish_reason is None and not res.finished and res.text == "ab"


def test_whole_response_text_calls_and_usage() -> None:
    """A non-streamed Responses answer: text of its message items, its function calls with
    their call ids, the usage, and "tool_calls" because the output holds calls."""
    output = [message("Let me look."), call_item(1, "f", '{"q": 1}'), call_item(2, "g", "{}")]
    body = response_obj("completed", output)
    raw = json.dumps(body).encode()
    res = run([raw[:50], raw[50:]], is_sse=False)
    assert res.text == "Let me look."
    assert res.tool_calls == [("f", '{"q": 1}', "call_1"), ("g", "{}", "call_2")]
    assert res.finish_reason == "tool_calls" and res.prompt_tokens == 11 and res.usage_tokens == 5
    assert res.ttft_s == 1.0 and res.e2e_s == 2.0 and res.finished


def test_whole_incomplete_response_is_length() -> None:
    """A whole answer cut by max_output_tokens reports "length" and keeps its text."""
    body = response_obj(
        "incomplete", [message("cut")], incomplete_details={"reason": "max_output_tokens"}
    )
    res = run([json.dumps(body).encode()], is_sse=False)
    assert res.finish_reason == "length" and res.text == "cut"


@pytest.mark.parametrize("per_read", [1, 2, 3, 50])
def test_stream_watch_sees_the_first_token_and_the_terminal_event(per_read: int) -> None:
    """The watch (answers nobody stores) finds a Responses stream's first delta and its
    terminal event, however the events are packed into reads, and not before that event."""
    events = text_stream(["a", "b", "c"])
    reads = [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]
    watch = StreamWatch(0.0)
    for i, chunk in enumerate(reads):
        watch.feed(chunk, float(i + 1))
        assert watch.final_event_seen() == (i == len(reads) - 1)
    assert watch.first_token_at == float(4 // per_read + 1)
