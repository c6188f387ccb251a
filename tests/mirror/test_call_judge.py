"""The mirror's tool-call judge (`gateway.mirror.replay.validity`): the declaration read from a
real request body once, every arm's observation given its verdict, failed answers left alone,
and every verdict exported from 0."""

from __future__ import annotations

import json

from domain.exposition import render
from domain.records import ObservationRecord
from gateway.mirror.replay.validity import CallJudge
from gateway.mirror.sampling.sampler import parse_request

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["location"],
        },
    },
}


def body(**extra: object) -> bytes:
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    return json.dumps({"model": "m", "messages": msgs, **extra}).encode()


def record(error_kind: str | None = None) -> ObservationRecord:
    return ObservationRecord(
        exchange_id="x", endpoint="e", arm="candidate", started_at=0.0, error_kind=error_kind
    )


def judged(judge: CallJudge, raw: bytes, calls: list[tuple[str, str, str | None]] | None) -> str:
    view = parse_request(raw)
    assert view is not None
    rec = record()
    judge.judge(rec, judge.declared(view, "/v1/chat/completions"), calls)
    return f"{rec.tool_check}|{rec.tool_error}"


def test_each_arm_gets_the_verdict_of_its_own_calls() -> None:
    """A valid call, a call missing a required argument (named by its JSON pointer, no value),
    and a text answer under "auto" are judged against the same declaration."""
    judge = CallJudge()
    raw = body(tools=[WEATHER], tool_choice="auto")
    assert judged(judge, raw, [("get_weather", '{"location": "Oslo"}', "call_1")]) == "valid|None"
    bad = judged(judge, raw, [("get_weather", '{"unit": "k"}', "call_1")])
    assert bad.startswith("schema|") and "Oslo" not in bad
    assert judged(judge, raw, None) == "valid|None"


def test_no_declaration_and_no_call_is_not_applicable_but_a_call_is_undeclared() -> None:
    """A request that declared no tools: a text answer is not judged, a call is undeclared."""
    judge = CallJudge()
    assert judged(judge, body(), None) == "None|None"
    assert judged(judge, body(), [("get_weather", "{}", "call_1")]).startswith("undeclared|")


def test_named_and_none_tool_choice_are_honoured() -> None:
    """A named tool_choice answered in text misses its call; "none" answered with a call is
    forbidden."""
    judge = CallJudge()
    named = body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}})
    assert judged(judge, named, None).startswith("missing_call|")
    none = body(tools=[WEATHER], tool_choice="none")
    call = [("get_weather", '{"location": "Oslo"}', "call_1")]
    assert judged(judge, none, call).startswith("forbidden_call|")


def test_a_failed_answer_is_never_judged_and_the_switch_turns_it_off() -> None:
    """A failed answer keeps no verdict (the failure metrics count it); `tool_check = false`
    judges nothing."""
    judge = CallJudge()
    view = parse_request(body(tools=[WEATHER]))
    assert view is not None
    rec = record("http_5xx")
    judge.judge(rec, judge.declared(view, "/v1/chat/completions"), None)
    assert rec.tool_check is None
    off = CallJudge(enabled=False)
    assert judged(off, body(tools=[WEATHER]), [("nope", "{}", None)]) == "None|None"


def test_a_declaration_sent_every_turn_is_parsed_once() -> None:
    """The same tools on every turn give the same parsed declaration object."""
    judge = CallJudge()
    a, b = parse_request(body(tools=[WEATHER])), parse_request(body(tools=[WEATHER]))
    assert a is not None and b is not None
    route = "/v1/chat/completions"
    assert judge.declared(a, route) is judge.declared(b, route)


def test_every_verdict_is_exported_from_zero() -> None:
    """Before any answer, each verdict's series exists at 0."""
    text = "\n".join(render(CallJudge().prometheus_lines()))
    for verdict in ("valid", "schema", "undeclared", "uncheckable"):
        assert f'verdict="{verdict}"' in text
