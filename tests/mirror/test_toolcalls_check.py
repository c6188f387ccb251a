"""Tool-call validity (gateway/mirror/toolcalls): each verdict on realistic requests, both APIs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from domain.outcomes import TOOL_CHECKS, TOOL_INVALID, ToolCheck
from gateway.mirror.toolcalls import CallCheck, Checker, ToolSpec

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["location"],
}
SEARCH_PARAMS = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
    },
    "required": ["query"],
    "additionalProperties": False,
}


def chat_tool(name: str, params: Any = None, **extra: Any) -> bytes:
    fn: dict[str, Any] = {"name": name, "description": f"the {name} tool", **extra}
    if params is not None:
        fn["parameters"] = params
    return json.dumps({"type": "function", "function": fn}).encode()


def responses_tool(name: str, params: Any = None, **extra: Any) -> bytes:
    tool: dict[str, Any] = {"type": "function", "name": name, **extra}
    if params is not None:
        tool["parameters"] = params
    return json.dumps(tool).encode()


CHAT_TOOLS = [chat_tool("get_weather", WEATHER_PARAMS), chat_tool("search", SEARCH_PARAMS)]
RESPONSES_TOOLS = [
    responses_tool("get_weather", WEATHER_PARAMS, strict=True),
    responses_tool("search", SEARCH_PARAMS),
    json.dumps({"type": "web_search"}).encode(),  # a built-in without a name
]


def spec(
    tools: list[bytes] | None = None, choice: Any = None, parallel: bool | None = None
) -> ToolSpec | None:
    raw = None if choice is None else json.dumps(choice).encode()
    return ToolSpec.from_request(CHAT_TOOLS if tools is None else tools, raw, parallel)


def weather(
    args: str = '{"location": "Paris, FR", "unit": "c"}', cid: str | None = "call_1"
) -> tuple[str, str, str | None]:
    return ("get_weather", args, cid)


def test_enum_codes_are_appended_and_invalid_set_is_exact() -> None:
    """Verdict codes keep their order; TOOL_INVALID is every verdict but VALID and UNCHECKABLE."""
    assert TOOL_CHECKS[0] is ToolCheck.VALID and len(TOOL_CHECKS) == 9
    assert set(ToolCheck) - {ToolCheck.VALID, ToolCheck.UNCHECKABLE} == TOOL_INVALID


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_valid_calls_in_both_shapes(api: str) -> None:
    """A well-formed call is VALID whether the tools came in the chat or the Responses shape."""
    s = spec(CHAT_TOOLS if api == "chat" else RESPONSES_TOOLS)
    calls = [weather(), ("search", '{"query": "news", "top_k": 3}', "call_2")]
    assert Checker().check(s, calls, api=api) == CallCheck(ToolCheck.VALID, calls=2)  # type: ignore[arg-type]


def test_nothing_declared_and_no_call_is_not_applicable() -> None:
    """With no tools, no tool_choice and no call there is nothing to judge (None)."""
    assert ToolSpec.from_request(None, None, None) is None
    assert ToolSpec.from_request([], None, False) is None
    assert Checker().check(None, []) is None
    assert Checker().check(None, None) is None


def test_call_without_declaration_is_undeclared() -> None:
    """A call in answer to a request that declared no tools is UNDECLARED."""
    out = Checker().check(None, [weather()])
    assert out is not None and out.check is ToolCheck.UNDECLARED and out.calls == 1


def test_text_answer_under_auto_is_valid() -> None:
    """An answer without calls under tool_choice auto (the default) is VALID with calls=0."""
    assert Checker().check(spec(), []) == CallCheck(ToolCheck.VALID, calls=0)
    assert Checker().check(spec(choice="auto"), None) == CallCheck(ToolCheck.VALID, calls=0)


def test_undeclared_function_name_is_not_echoed() -> None:
    """A call to a function the request never declared is UNDECLARED, and its name is not echoed."""
    out = Checker().check(spec(), [weather(), ("sk_live_SECRET", "{}", "call_2")])
    assert out is not None and out.check is ToolCheck.UNDECLARED
    assert out.error is not None and "SECRET" not in out.error and "call 1" in out.error


@pytest.mark.parametrize("args", ['{"location": "Paris"', "", "Paris", '["Paris"]', '"Paris"', "3"])
def test_arguments_not_an_object(args: str) -> None:
    """Arguments that are not JSON, or JSON but not an object, are NOT_OBJECT."""
    out = Checker().check(spec(), [weather(args)])
    assert out is not None and out.check is ToolCheck.NOT_OBJECT
    assert out.error is not None and "Paris" not in out.error


def test_schema_violation_reports_pointer_and_keyword() -> None:
    """A value outside the enum is SCHEMA with the pointer of the value and the keyword."""
    out = Checker().check(spec(), [weather('{"location": "Paris", "unit": "kelvin"}')])
    assert out == CallCheck(
        ToolCheck.SCHEMA, pointer="/unit", error="call 0 get_weather: /unit: enum", calls=1
    )


@pytest.mark.parametrize(
    ("args", "pointer", "keyword"),
    [
        ('{"top_k": 3}', "", "required"),
        ('{"query": "q", "top_k": 11}', "/top_k", "maximum"),
        ('{"query": "q", "top_k": 2.5}', "/top_k", "type"),
        ('{"query": "q", "extra": 1}', "", "additionalProperties"),
    ],
)
def test_search_schema_violations(args: str, pointer: str, keyword: str) -> None:
    """Missing required fields, bounds, types and extra fields are SCHEMA at the right pointer."""
    out = Checker().check(spec(), [("search", args, "c1")])
    assert out is not None and out.check is ToolCheck.SCHEMA
    assert out.pointer == pointer and out.error is not None and out.error.endswith(keyword)


def test_secret_values_never_appear_in_errors() -> None:
    """Neither an argument value nor an undeclared key of the arguments reaches `error`."""
    secret = "sk-proj-0123456789SECRET"
    checker = Checker()
    params = {
        "type": "object",
        "properties": {"note": {"type": "string", "maxLength": 3}},
        "additionalProperties": {"type": "integer"},
    }
    s = spec([chat_tool("save", params)])
    for args in (
        json.dumps({"note": secret}),
        json.dumps({secret: "not an integer"}),
        json.dumps({"note": [secret]}),
        json.dumps([secret]),
        '{"note": "' + secret,
    ):
        out = checker.check(s, [("save", args, "c1")])
        assert out is not None and out.check in TOOL_INVALID
        assert out.error is not None and secret not in out.error and len(out.error) <= 160
    out = checker.check(s, [("save", json.dumps({secret: "x"}), "c1")])
    assert out is not None and out.error == "call 0 save: /*: type"


def test_tool_without_parameters_accepts_any_object() -> None:
    """A function declared without parameters accepts any JSON object and nothing else."""
    s = spec([chat_tool("now"), responses_tool("ping", None)])
    assert Checker().check(s, [("now", '{"tz": "UTC", "n": [1]}', "c1")]).check is ToolCheck.VALID  # type: ignore[union-attr]
    assert Checker().check(s, [("ping", "{}", "c1")], api="responses").check is ToolCheck.VALID  # type: ignore[union-attr]
    assert Checker().check(s, [("now", "[]", "c1")]).check is ToolCheck.NOT_OBJECT  # type: ignore[union-attr]


def test_strict_does_not_change_the_check() -> None:
    """`strict: true` is recorded but the schema alone decides (an optional field may be absent)."""
    s = spec([chat_tool("get_weather", WEATHER_PARAMS, strict=True)])
    assert Checker().check(s, [weather('{"location": "Oslo"}')]).check is ToolCheck.VALID  # type: ignore[union-attr]
    assert s is not None and s.tools["get_weather"].strict is True


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_tool_choice_none_with_a_call_is_forbidden(api: str) -> None:
    """tool_choice "none" answered with a call is FORBIDDEN_CALL (checked before anything else)."""
    s = spec(CHAT_TOOLS if api == "chat" else RESPONSES_TOOLS, choice="none")
    out = Checker().check(s, [("undeclared", "not json", None)], api=api)  # type: ignore[arg-type]
    assert out is not None and out.check is ToolCheck.FORBIDDEN_CALL
    assert Checker().check(s, []) == CallCheck(ToolCheck.VALID)


def test_tool_choice_required_with_text_only_is_missing_call() -> None:
    """tool_choice "required" answered with text only is MISSING_CALL."""
    out = Checker().check(spec(choice="required"), [])
    assert out is not None and out.check is ToolCheck.MISSING_CALL and out.calls == 0
    assert Checker().check(spec(choice="required"), [weather()]).check is ToolCheck.VALID  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tools", "choice", "api"),
    [
        (CHAT_TOOLS, {"type": "function", "function": {"name": "search"}}, "chat"),
        (RESPONSES_TOOLS, {"type": "function", "name": "search"}, "responses"),
    ],
)
def test_named_tool_choice(tools: list[bytes], choice: Any, api: Any) -> None:
    """A named tool_choice is met by one call to that name; other calls are judged normally."""
    s = spec(tools, choice=choice)
    checker = Checker()
    missing = checker.check(s, [weather()], api=api)
    assert missing is not None and missing.check is ToolCheck.MISSING_CALL
    assert missing.error == "tool_choice names search: no call to it"
    assert checker.check(s, [], api=api).check is ToolCheck.MISSING_CALL  # type: ignore[union-attr]
    both = [weather(), ("search", '{"query": "q"}', "call_2")]
    assert checker.check(s, both, api=api).check is ToolCheck.VALID  # type: ignore[union-attr]
    bad_other = [weather('{"unit": "c"}'), ("search", '{"query": "q"}', "call_2")]
    assert checker.check(s, bad_other, api=api).check is ToolCheck.SCHEMA  # type: ignore[union-attr]


def test_parallel_calls_when_not_allowed() -> None:
    """Two calls while parallel_tool_calls is false are PARALLEL; one call, or true, is fine."""
    two = [weather(), weather(cid="call_2")]
    out = Checker().check(spec(parallel=False), two)
    assert out is not None and out.check is ToolCheck.PARALLEL and out.calls == 2
    assert Checker().check(spec(parallel=False), [weather()]).check is ToolCheck.VALID  # type: ignore[union-attr]
    assert Checker().check(spec(parallel=True), two).check is ToolCheck.VALID  # type: ignore[union-attr]
    assert Checker().check(spec(parallel=None), two).check is ToolCheck.VALID  # type: ignore[union-attr]


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(
    "ids", [(None,), ("",), ("call_1", None), ("call_1", "call_1"), ("a", "b", "a")]
)
def test_call_ids_missing_or_duplicated(api: Any, ids: tuple[str | None, ...]) -> None:
    """A missing, empty or repeated call id is CALL_ID, checked before the calls' arguments."""
    calls = [weather("not json", cid) for cid in ids]
    out = Checker().check(spec(), calls, api=api)
    assert out is not None and out.check is ToolCheck.CALL_ID
    assert out.error is not None and ("call_id" in out.error) == (api == "responses")


def test_first_problem_in_call_order_wins() -> None:
    """Per call the order is UNDECLARED, NOT_OBJECT, SCHEMA; the earliest bad call is reported."""
    checker = Checker()
    calls = [weather(), ("search", "{", "c2"), ("nope", "{}", "c3")]
    assert checker.check(spec(), calls).check is ToolCheck.NOT_OBJECT  # type: ignore[union-attr]
    calls = [("nope", "{", "c1"), ("search", "{", "c2")]
    assert checker.check(spec(), calls).check is ToolCheck.UNDECLARED  # type: ignore[union-attr]


def test_non_function_tools_are_names_only() -> None:
    """A named built-in tool declares its name: a call to it is not UNDECLARED nor parsed."""
    tools = [*RESPONSES_TOOLS, json.dumps({"type": "custom", "name": "run_sql"}).encode()]
    s = spec(tools)
    assert s is not None and set(s.tools) == {"get_weather", "search", "run_sql"}
    out = Checker().check(s, [("run_sql", "SELECT 1", "c1")], api="responses")
    assert out is not None and out.check is ToolCheck.VALID


@pytest.mark.parametrize(
    ("tools", "choice"),
    [
        ([b'{"type": "function", "function": {"description": "no name"}}'], None),
        ([b"[1, 2]"], None),
        ([b"{not json"], None),
        ([chat_tool("a"), chat_tool("a")], None),
        (CHAT_TOOLS, "sometimes"),
        (CHAT_TOOLS, {"type": "allowed_tools", "mode": "auto", "tools": []}),
    ],
)
def test_malformed_declarations_are_uncheckable(tools: list[bytes], choice: Any) -> None:
    """A declaration that cannot be read makes every answer UNCHECKABLE, counted invalid_schema."""
    checker = Checker()
    s = spec(tools, choice=choice)
    assert s is not None and s.malformed is not None
    out = checker.check(s, [weather()])
    assert out is not None and out.check is ToolCheck.UNCHECKABLE
    assert checker.counters["uncheckable_invalid_schema"] == 1


def test_oversized_arguments_are_uncheckable_too_big() -> None:
    """Arguments over max_arguments_bytes are not decoded: UNCHECKABLE, cause too_big."""
    checker = Checker(max_arguments_bytes=1024)
    big = json.dumps({"location": "x" * 2000})
    out = checker.check(spec(), [weather(big)])
    assert out is not None and out.check is ToolCheck.UNCHECKABLE and out.error is not None
    assert out.error.endswith("too_big") and checker.counters["uncheckable_too_big"] == 1
    wide = json.dumps({"location": "é" * 400}, ensure_ascii=False)  # 400 characters, 800 bytes
    assert checker.check(spec(), [weather(wide)]).check is ToolCheck.VALID  # type: ignore[union-attr]


def test_uncheckable_call_does_not_hide_an_invalid_one() -> None:
    """One call that cannot be judged and a later undeclared call: the answer is UNDECLARED."""
    checker = Checker(max_arguments_bytes=64)
    calls = [weather(json.dumps({"location": "x" * 100})), ("nope", "{}", "c2")]
    assert checker.check(spec(), calls).check is ToolCheck.UNDECLARED  # type: ignore[union-attr]
    assert checker.check(spec(), calls[:1]).check is ToolCheck.UNCHECKABLE  # type: ignore[union-attr]
