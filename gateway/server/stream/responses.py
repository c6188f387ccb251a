"""The OpenAI Responses API (`/v1/responses`) as the meter and the watch read it: the few fields
the meter decodes, the events that carry tokens or end a stream, and how a response's status
maps to the observation's finish reason.

A streamed Responses answer is SSE with an `event:` line and a `data:` line per event; the data
carries the same name in its `type`. The meter (`server/meter.py`) decodes a payload with one
Struct for a chat chunk and another for a Responses event, chosen by the `event:` line (chat
chunks have none), and a whole answer with one Struct for both (`choices`, or `output`). The
tables below are the one place that says which events carry tokens, which end the stream and
which are not decoded at all (docs/metrics.md, "The Responses API").

It must never import asyncio or aiohttp, and declares only fields the meter reads (msgspec skips
the rest: the request's echo in `response.created`, logprobs, annotations).
"""

from __future__ import annotations

from typing import Final

import msgspec


class PromptDetails(msgspec.Struct, gc=False):
    """`prompt_tokens_details` (chat) or `input_tokens_details` (Responses)."""

    cached_tokens: int | None = None


class Usage(msgspec.Struct, gc=False):
    """The engine's usage, in chat's names and in the Responses API's."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: PromptDetails | None = None


class Part(msgspec.Struct, gc=False):
    """One content part of an output item (`output_text`, `refusal`, `reasoning_text`)."""

    type: str = ""
    text: str | None = None
    refusal: str | None = None


class Item(msgspec.Struct, gc=False):
    """One output item: a `message`, a `function_call`, a `reasoning` item, or another kind."""

    type: str = ""
    id: str | None = None
    name: str | None = None
    arguments: str | None = None
    call_id: str | None = None
    content: list[Part] | None = None


class Details(msgspec.Struct, gc=False):
    reason: str | None = None


class Response(msgspec.Struct, gc=False):
    """The response object: a whole answer, or the one a terminal stream event carries."""

    status: str | None = None
    output: list[Item] | None = None
    usage: Usage | None = None
    incomplete_details: Details | None = None


class Event(msgspec.Struct, gc=False):
    """One stream event: its `type` and the fields the meter reads of the kinds it reads."""

    type: str = ""
    delta: str | None = None
    output_index: int | None = None
    item_id: str | None = None
    item: Item | None = None
    arguments: str | None = None
    response: Response | None = None
    usage: Usage | None = None  # no event of OpenAI's has one at the top; read if one does


# Events whose `delta` is generated output: the first is the TTFT, each is a token event.
TEXT_DELTAS: Final = frozenset({"response.output_text.delta", "response.refusal.delta"})
ARGUMENT_DELTA: Final = "response.function_call_arguments.delta"
TOKEN_EVENTS: Final = TEXT_DELTAS | {
    ARGUMENT_DELTA,
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
}
ITEM_ADDED: Final = "response.output_item.added"
ITEM_DONE: Final = "response.output_item.done"
ARGUMENTS_DONE: Final = "response.function_call_arguments.done"
# The events that end a stream; each carries the response with its status and usage.
TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
ERROR_EVENT: Final = "error"
# Events named on their `event:` line that carry nothing the meter reads: counted, not decoded.
# `response.created` and `response.in_progress` echo the whole request (its tools and
# instructions: kilobytes for an agent), the `.done` of text, parts and reasoning repeat what
# the deltas said.
SKIPPED: Final = frozenset(
    {
        b"response.created",
        b"response.in_progress",
        b"response.queued",
        b"response.content_part.added",
        b"response.content_part.done",
        b"response.output_text.done",
        b"response.output_text.annotation.added",
        b"response.refusal.done",
        b"response.reasoning_text.done",
        b"response.reasoning_part.added",
        b"response.reasoning_part.done",
        b"response.reasoning_summary_part.added",
        b"response.reasoning_summary_part.done",
        b"response.reasoning_summary_text.done",
    }
)
FUNCTION_CALL: Final = "function_call"
MESSAGE: Final = "message"
TEXT_PARTS: Final = frozenset({"output_text", "refusal"})
# `finish_reason` of a failed response (`response.failed`, `status: "failed"`, an `error`
# event): not one of chat's reasons, so the evaluators count it as "other".
FAILED: Final = "error"


def finish_reason(status: str | None, details: Details | None, calls: bool) -> str | None:
    """Chat's finish reason for a Responses status: `completed` is "tool_calls" when the output
    holds a function call, else "stop"; `incomplete` is "length" for `max_output_tokens` (or no
    reason given), "content_filter" for that reason, else "other"; `failed` and `cancelled` are
    "error"; `in_progress` / `queued` (a background response) or none: None (not finished)."""
    if status == "completed":
        return "tool_calls" if calls else "stop"
    if status == "incomplete":
        reason = details.reason if details is not None else None
        if reason is None or reason == "max_output_tokens":
            return "length"
        return "content_filter" if reason == "content_filter" else "other"
    if status in ("failed", "cancelled"):
        return FAILED
    return None


def item_text(item: Item) -> str:
    """The visible text of a `message` item: its `output_text` and `refusal` parts, in order."""
    parts = item.content
    if not parts:
        return ""
    return "".join(
        (p.text or "") if p.type == "output_text" else (p.refusal or p.text or "")
        for p in parts
        if p.type in TEXT_PARTS
    )
