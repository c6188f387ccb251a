"""Chat and text completions (`/v1/chat/completions`, `/v1/completions`) as the meter reads
them: the few fields of a stream chunk or a whole answer it decodes (msgspec skips the rest),
and their decoders, built once. The Responses API's shapes are in `responses.py`.

It must never import asyncio or aiohttp: a leaf the meter (`server/meter.py`) may import.
"""

from __future__ import annotations

import msgspec

from gateway.server.stream.responses import Details, Item, Usage


class Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class ToolCall(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: Function | None = None


class Message(msgspec.Struct, gc=False):
    """A chat `delta` (stream) or `message` (whole response)."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: Message | None = None
    message: Message | None = None
    text: str | None = None  # /v1/completions
    finish_reason: str | None = None


class Body(msgspec.Struct, gc=False):
    """A chat or completions chunk or answer. Only these two fields: every key of a chunk is
    looked up among the Struct's fields, per event, so a field added here costs every chunk."""

    choices: list[Choice] | None = None
    usage: Usage | None = None


class Whole(Body, gc=False):
    """A whole (non-streamed) answer: chat's, or the Responses API's (`output`, `status`)."""

    output: list[Item] | None = None
    status: str | None = None
    incomplete_details: Details | None = None


CHUNK_DECODER = msgspec.json.Decoder(Body)
WHOLE_DECODER = msgspec.json.Decoder(Whole)
