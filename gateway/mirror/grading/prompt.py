"""What the grader is shown, pure: the conversation (the declared tools, then every message with
its calls and tool results, as the engine saw them) and each answer (its text, then its calls).

A call is one line everywhere, in the conversation and in the answers alike:
`[call] name {"canonical":"json"}`: arguments that parse as JSON are re-encoded with sorted keys
and no spaces (two models that make the same call read the same, whatever their spacing or key
order); arguments that do not parse are shown as their raw text after `(arguments not JSON)`.

Chat requests (`messages`: assistant messages with `tool_calls`, `role: "tool"` results) and
Responses requests (`input`: `message`, `function_call` and `function_call_output` items, and
`instructions`) are read alike. Every part is bounded by `grading_max_chars`, and a cut says what
it cut: the tools (each keeps its name; their descriptions and parameters share what is left
evenly), the messages (the end is kept: it is what was answered), each answer (its start).
Pure: no IO; it never raises on a malformed request (what it cannot read, it leaves out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgspec

__all__ = ["Reply", "answer_text", "call_line", "conversation_text", "tools_text"]

_canonical: Final = msgspec.json.Encoder(order="sorted").encode
_decode_any: Final = msgspec.json.Decoder().decode
_TOOLS_HEAD: Final = "Tools the assistant may call:"
_ELLIPSIS: Final = "…"


class Reply(NamedTuple):
    """One arm's answer as the grader reads it: its kept text and its calls (the observation's
    `tool_calls` JSON text, `[{"name": …, "arguments": …, "id"?: …}]`)."""

    text: str | None
    tool_calls: str | None


def call_line(name: object, arguments: object) -> str:
    """`[call] name {canonical JSON}`, or the raw arguments marked as not JSON."""
    if isinstance(arguments, str):
        try:
            args = _canonical(_decode_any(arguments.encode())).decode()
        except (msgspec.DecodeError, msgspec.EncodeError):
            args = f"(arguments not JSON) {arguments}"
    elif arguments is None:
        args = "{}"
    else:  # a request may carry the arguments as an object already
        try:
            args = _canonical(arguments).decode()
        except (msgspec.EncodeError, TypeError):
            args = f"(arguments not JSON) {arguments}"
    return f"[call] {name if isinstance(name, str) else ''} {args}"


def _calls_of(tool_calls: str | None) -> list[str]:
    """The call lines of an observation's stored calls (a malformed list: its raw text)."""
    if not tool_calls:
        return []
    try:
        calls = _decode_any(tool_calls.encode())
    except msgspec.DecodeError:
        return [f"[calls, not JSON] {tool_calls}"]
    if not isinstance(calls, list):
        return [f"[calls, not JSON] {tool_calls}"]
    return [call_line(c.get("name"), c.get("arguments")) for c in calls if isinstance(c, Mapping)]


def answer_text(reply: Reply, max_chars: int) -> tuple[str, int]:
    """(what the grader reads of an answer, its full length in characters): the text, then one
    line per call; past `max_chars` its start, and a line saying how much was cut."""
    parts = [reply.text] if reply.text else []
    parts.extend(_calls_of(reply.tool_calls))
    full = "\n".join(parts)
    if len(full) <= max_chars:
        return full, len(full)
    return f"{full[:max_chars]}\n[… {len(full) - max_chars:,} more characters cut]", len(full)


# ---------------------------------------------------------------------- the declared tools


def _tool_entry(tool: object) -> tuple[str, str] | None:
    """(name, description and parameters) of a Chat (`function: {...}`) or Responses (flat)
    tool declaration; a tool of another type is listed by its type."""
    if not isinstance(tool, Mapping):
        return None
    fn = tool.get("function")
    spec: Mapping[str, Any] = fn if isinstance(fn, Mapping) else tool
    name = spec.get("name") if isinstance(spec.get("name"), str) else tool.get("type")
    if not isinstance(name, str):
        return None
    bits = []
    if isinstance(desc := spec.get("description"), str) and desc:
        bits.append(desc)
    if (params := spec.get("parameters")) is not None:
        try:
            bits.append(f"parameters: {_canonical(params).decode()}")
        except (msgspec.EncodeError, TypeError):
            bits.append(f"parameters: {params}")
    return name, "\n  ".join(bits)


def _fair_shares(lengths: Sequence[int], budget: int) -> list[int]:
    """Max-min fair shares of `budget` characters: a part shorter than an even share is kept
    whole and what it leaves goes to the others."""
    shares = [0] * len(lengths)
    left = sorted(range(len(lengths)), key=lambda i: lengths[i])
    while left:
        even = max(budget, 0) // len(left)
        i = left[0]
        if lengths[i] <= even:
            shares[i] = lengths[i]
            budget -= lengths[i]
            left.pop(0)
            continue
        for j in left:
            shares[j] = even
        break
    return shares


def tools_text(tools: object, max_chars: int) -> str:
    """The declared tools, one entry each (name: description, then parameters as canonical
    JSON), within `max_chars`. Cut fairly: every tool keeps its name while the names fit, and
    the descriptions and parameters share the rest evenly; the cut is said in a last line."""
    if not isinstance(tools, list):
        return ""
    entries = [e for e in map(_tool_entry, tools) if e is not None]
    if not entries:
        return ""
    lines = [f"- {n}: {b}" if b else f"- {n}" for n, b in entries]
    full = "\n".join([_TOOLS_HEAD, *lines])
    if len(full) <= max_chars:
        return full
    n = len(entries)
    note_room = 160  # the closing line that says what was cut
    fixed = len(_TOOLS_HEAD) + sum(len(f"\n- {name}: ") for name, _ in entries)
    budget = max_chars - fixed - note_room
    if budget < n * 8:  # not even the names with a few characters each: list the names that fit
        shown: list[str] = []
        used = len(_TOOLS_HEAD) + note_room
        for name, _ in entries:
            if used + len(name) + 3 > max_chars:
                break
            shown.append(f"- {name}")
            used += len(name) + 3
        note = (
            f"[{n - len(shown):,} of {n:,} tools not shown, and the descriptions and parameters "
            f"of all: the tools take {len(full):,} characters, more than {max_chars:,}]"
        )
        return "\n".join([_TOOLS_HEAD, *shown, note])
    shares = _fair_shares([len(b) for _, b in entries], budget - n)  # n: the marks
    out = [_TOOLS_HEAD]
    cut = 0
    for (name, body), share in zip(entries, shares, strict=True):
        if len(body) > share:
            body = body[:share] + _ELLIPSIS
            cut += 1
        out.append(f"- {name}: {body}")
    out.append(
        f"[the descriptions and parameters of {cut:,} of {n:,} tools are cut (marked {_ELLIPSIS}): "
        f"the tools take {len(full):,} characters, more than {max_chars:,}]"
    )
    return "\n".join(out)


# ---------------------------------------------------------------------- the messages


def _content(content: object) -> str:
    """A message's content: a string, or the text of its parts (Chat's `text`, Responses'
    `input_text` / `output_text`); other parts are left out."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def _chat_lines(messages: list[Any]) -> list[str]:
    lines: list[str] = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = m.get("role", "user")
        content = _content(m.get("content"))
        if role in ("tool", "function"):
            ref = m.get("tool_call_id") or m.get("name") or ""
            lines.append(f"{role} [result of {ref}]: {content}")
            continue
        calls = m.get("tool_calls")
        legacy = m.get("function_call")
        if isinstance(legacy, Mapping):
            calls = [*(calls if isinstance(calls, list) else ()), {"function": legacy}]
        if not isinstance(calls, list) or not calls:
            lines.append(f"{role}: {content}")
            continue
        if content:
            lines.append(f"{role}: {content}")
        for c in calls:
            if not isinstance(c, Mapping):
                continue
            fn = c.get("function")
            fn = fn if isinstance(fn, Mapping) else {}
            ident = f" (id {c['id']})" if isinstance(c.get("id"), str) else ""
            lines.append(f"{role}: {call_line(fn.get('name'), fn.get('arguments'))}{ident}")
    return lines


def _responses_lines(request: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    if isinstance(instructions := request.get("instructions"), str) and instructions:
        lines.append(f"system: {instructions}")
    items = request.get("input")
    if isinstance(items, str):
        return [*lines, f"user: {items}"]
    if not isinstance(items, list):
        return lines
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            lines.append(f"{item.get('role', 'user')}: {_content(item.get('content'))}")
        elif kind == "function_call":
            ident = f" (id {item['call_id']})" if isinstance(item.get("call_id"), str) else ""
            call = call_line(item.get("name"), item.get("arguments"))
            lines.append(f"assistant: {call}{ident}")
        elif kind == "function_call_output":
            lines.append(
                f"tool [result of {item.get('call_id', '')}]: {_content(item.get('output'))}"
            )
    return lines


def conversation_text(request: Mapping[str, Any], max_chars: int) -> str:
    """The conversation as the grader reads it: the declared tools (if any, within `max_chars`),
    then `role: content` lines with each call and tool result (Chat `messages`, Responses
    `input`, or a completion's `prompt`); of the lines, the last `max_chars` characters, with a
    line saying how many earlier characters were cut."""
    messages = request.get("messages")
    if isinstance(messages, list):
        text = "\n".join(_chat_lines(messages))
    elif "input" in request:
        text = "\n".join(_responses_lines(request))
    else:
        prompt = request.get("prompt")
        text = prompt if isinstance(prompt, str) else ""
    if len(text) > max_chars:
        text = f"[… {len(text) - max_chars:,} earlier characters cut]\n{text[-max_chars:]}"
    tools = tools_text(request.get("tools"), max_chars)
    return f"{tools}\n\n{text}" if tools else text
