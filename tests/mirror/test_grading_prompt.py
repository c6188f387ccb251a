"""What the grader is shown for an agent turn (gateway.mirror.grading.prompt): the declared tools,
the conversation with its calls and tool results (Chat `messages` or Responses `input` alike),
each answer's text and calls with canonical JSON arguments (raw text marked when not JSON), and
every cut within grading_max_chars saying what it cut. The whole prompt of one agent turn is held
in a golden file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from domain.endpoint import GraderSpec
from gateway.mirror.grading import request as rq
from gateway.mirror.grading.prompt import Reply, answer_text, conversation_text, tools_text

GOLDEN = Path(__file__).parent / "golden" / "grading_agent_turn.txt"
SPEC = GraderSpec(url="http://127.0.0.1:9", model="judge")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["c", "f"]}, "city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "The local time."}},
]
# One agent turn: the user asked, the assistant called a tool, the tool answered, the user
# asks again; the tools are declared.
CHAT: dict[str, Any] = {
    "model": "m",
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": [{"type": "text", "text": "And in Rome, in fahrenheit?"}]},
    ],
}
# The same turn as a Responses request.
RESPONSES: dict[str, Any] = {
    "model": "m",
    "instructions": "You are a travel assistant.",
    "tools": [{"type": "function", **t["function"]} for t in TOOLS],
    "input": [
        {"type": "message", "role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"temp": 21, "sky": "clear"}',
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 21 °C and clear in Paris."}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "And in Rome, in fahrenheit?"}],
        },
    ],
}
# The candidate calls with its keys in another order and spaces; production answers in text.
CALL = json.dumps([{"name": "get_weather", "arguments": '{ "unit": "f",  "city": "Rome" }'}])
TEXT = "Let me check: Rome is usually warm."


def _prompt(first: bool) -> str:
    conv = conversation_text(CHAT, 4000)
    cand, _ = answer_text(Reply(None, CALL), 4000)
    ref, _ = answer_text(Reply(TEXT, None), 4000)
    body = json.loads(rq.grader_body(SPEC, conv, cand, ref, candidate_shown_first=first))
    content: str = body["messages"][0]["content"]
    return content


def test_agent_turn_prompt_matches_the_golden_file() -> None:
    """The exact prompt of one agent turn (tools, a call and its result in the history, a call
    answer against a text answer) is the golden file's (CANARY_UPDATE_GOLDEN=1 rewrites it)."""
    got = _prompt(first=True)
    if os.environ.get("CANARY_UPDATE_GOLDEN"):
        GOLDEN.write_text(got, encoding="utf-8")
    assert got == GOLDEN.read_text(encoding="utf-8")
    # Its parts, for a reader of a failure: canonical arguments, the rubric on calls.
    assert '[Answer A]\n[call] get_weather {"city":"Rome","unit":"f"}\n\n[Answer B]\n' in got
    assert "right tool with the right arguments" in got
    assert "candidate" not in got and "production" not in got


def test_responses_input_reads_as_the_chat_messages() -> None:
    """A Responses request (`instructions`, `input` items: message, function_call,
    function_call_output; flat tool declarations) shows the grader the same conversation as
    the same turn sent as Chat messages."""
    assert conversation_text(RESPONSES, 4000) == conversation_text(CHAT, 4000)
    assert conversation_text({"input": "hi"}, 100) == "user: hi"


def test_call_arguments_canonical_or_marked_not_json() -> None:
    """Two spellings of the same call read the same; arguments that are not JSON are shown as
    their raw text, marked; an `id` key (newer observations) is accepted and not shown."""
    a = json.dumps([{"name": "f", "arguments": '{"b": 1, "a": [1, 2]}', "id": "call_9"}])
    b = json.dumps([{"name": "f", "arguments": '{"a":[1,2],"b":1}'}])
    assert answer_text(Reply(None, a), 100) == answer_text(Reply(None, b), 100)
    assert answer_text(Reply(None, a), 100)[0] == '[call] f {"a":[1,2],"b":1}'
    raw = json.dumps([{"name": "f", "arguments": "{city: Rome"}])
    assert answer_text(Reply("ok", raw), 100)[0] == "ok\n[call] f (arguments not JSON) {city: Rome"


def test_answer_cut_says_how_much() -> None:
    """An answer past max_chars keeps its start and says how many characters were cut; its
    full length is still what the length bias is measured on."""
    text, n = answer_text(Reply("x" * 50, None), 20)
    assert n == 50 and text == "x" * 20 + "\n[… 30 more characters cut]"


def test_messages_cut_keeps_the_end_and_says_so() -> None:
    """A long history keeps its last max_chars characters (what was answered) and says how many
    earlier characters were cut."""
    req = {"messages": [{"role": "user", "content": "a" * 100}, {"role": "user", "content": "end"}]}
    text = conversation_text(req, 20)
    assert text.startswith("[… 96 earlier characters cut]\n") and text.endswith("user: end")


def test_tools_cut_fairly_within_max_chars() -> None:
    """Forty tools with long descriptions fit max_chars: every tool keeps its name, the short
    description stays whole, the long ones share the rest evenly, and a last line says what was
    cut; hundreds of tools past even their names say how many are not shown."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 300}}
        for i in range(40)
    ]
    tools.append({"type": "function", "function": {"name": "short", "description": "tiny"}})
    text = tools_text(tools, 4000)
    assert len(text) <= 4000
    assert all(f"- tool_{i}: " in text for i in range(40)) and "- short: tiny\n" in text
    cut = [line for line in text.splitlines() if line.startswith("- tool_")]
    assert len({len(line) for line in cut}) <= 2  # even shares (the name's digits aside)
    assert text.splitlines()[-1].startswith("[the descriptions and parameters of 40 of 41 tools")
    many = [{"type": "function", "function": {"name": f"t{i:04d}"}} for i in range(2000)]
    text = tools_text(many, 1000)
    assert len(text) <= 1000 and "tools not shown" in text.splitlines()[-1]
