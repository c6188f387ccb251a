"""The OpenAI / vLLM wire format, as the simulator speaks it.

Request Structs decode only the fields the simulator uses (unknown fields are ignored, as vLLM
does). Response builders reproduce vLLM's JSON key order and its SSE framing: `data: {json}\\n\\n`
events, one token per chunk, `[DONE]` at the end. The per-token chunk is a precomputed prefix and
suffix around one encoded string, so streaming costs one small encode per token.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from gateway.sim.engine import Plan

DONE = b"data: [DONE]\n\n"
_CHAT_TAIL = b'},"logprobs":null,"finish_reason":null}]}\n\n'
_TEXT_TAIL = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

_encode = msgspec.json.Encoder().encode

MaxTokens = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0.0)]


class ContentPart(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class FunctionCall(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class MessageToolCall(msgspec.Struct):
    function: FunctionCall
    id: str = ""
    type: str = "function"


class Message(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None

    def text(self) -> str:
        """The message as the template sees it: its text, then any tool calls it made."""
        if isinstance(self.content, str):
            text = self.content
        elif self.content:
            text = "".join(p.text if p.text is not None else f"<{p.type}>" for p in self.content)
        else:
            text = ""
        if self.tool_calls:
            calls = [
                {"name": c.function.name, "arguments": c.function.arguments}
                for c in self.tool_calls
            ]
            text += _encode(calls).decode()
        return text


class FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct):
    function: FunctionDef
    type: str = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: str = "function"


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class JsonSchema(msgspec.Struct):
    name: str = ""


class ResponseFormat(msgspec.Struct):
    type: str = "text"
    json_schema: JsonSchema | None = None


class ChatRequest(msgspec.Struct):
    messages: list[Message]
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    seed: int | None = None
    n: int | None = 1
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None


class CompletionRequest(msgspec.Struct):
    prompt: str | list[str | int]
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = 16  # vLLM's (and OpenAI's legacy) default
    temperature: Temperature | None = None
    seed: int | None = None
    n: int | None = 1
    user: str | None = None
    prompt_logprobs: int | None = None  # scoring (teacher forcing): top-k per prompt position


class EmbeddingRequest(msgspec.Struct):
    input: str | list[Any]
    model: str | None = None
    encoding_format: str = "float"


class TokenizeRequest(msgspec.Struct):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def error_body(message: str, type_: str, code: int) -> bytes:
    return _encode({"error": {"message": message, "type": type_, "param": None, "code": code}})


def usage(plan: Plan, completion_tokens: int) -> dict[str, Any]:
    prompt = plan.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
    }


class ChunkEncoder:
    """SSE events for one streamed response (chat or text completion)."""

    __slots__ = ("_chat", "_head", "_meta", "_open", "_tail")

    def __init__(self, *, chat: bool, request_id: str, created: int, model: str) -> None:
        self._chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._meta: dict[str, Any] = {
            "id": request_id,
            "object": obj,
            "created": created,
            "model": model,
        }
        head = _encode(self._meta)[:-1] + b',"choices":['
        self._head = b"data: " + head
        # The per-token event is a fixed prefix, the encoded piece, a fixed suffix.
        self._open = self._head + (
            b'{"index":0,"delta":{"content":' if chat else b'{"index":0,"text":'
        )
        self._tail = _CHAT_TAIL if chat else _TEXT_TAIL

    def _event(self, choice: dict[str, Any]) -> bytes:
        return self._head + _encode(choice) + b"]}\n\n"

    def role(self) -> bytes:
        return self._event(
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )

    def token(self, piece: str, finish: str | None = None) -> bytes:
        if finish is None:
            return self._open + _encode(piece) + self._tail
        key = "delta" if self._chat else "text"
        value: Any = {"content": piece} if self._chat else piece
        return self._event(
            {"index": 0, key: value, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        )

    def tool_call(self, index: int, call_id: str, name: str) -> bytes:
        """The step that announces call `index`: its id and name, no arguments yet."""
        call = {
            "id": call_id,
            "type": "function",
            "index": index,
            "function": {"name": name, "arguments": ""},
        }
        return self._event(
            {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
        )

    def tool_arguments(self, index: int, fragment: str, finish: str | None = None) -> bytes:
        delta = {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        choice["finish_reason"] = finish
        if finish is not None:
            choice["stop_reason"] = None
        return self._event(choice)

    def end(self, finish: str) -> bytes:
        """The end-of-sequence step: no text, the finish reason."""
        delta: Any = ({"content": ""} if finish != "tool_calls" else {}) if self._chat else ""
        key = "delta" if self._chat else "text"
        return self._event(
            {"index": 0, key: delta, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        )

    def usage(self, plan: Plan, completion_tokens: int) -> bytes:
        body = {**self._meta, "choices": [], "usage": usage(plan, completion_tokens)}
        return b"data: " + _encode(body) + b"\n\n"


def chat_completion(
    plan: Plan, request_id: str, created: int, model: str, completion_tokens: int
) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    if plan.calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": a}}
            for call, a in zip(plan.calls, plan.arguments(), strict=True)
        ]
    else:
        message["content"] = "".join(plan.pieces)
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": plan.finish_reason,
        "stop_reason": None,
    }
    return _encode(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(plan, completion_tokens),
            "prompt_logprobs": None,
        }
    )


def text_completion(
    plan: Plan, request_id: str, created: int, model: str, completion_tokens: int
) -> bytes:
    choice = {
        "index": 0,
        "text": "".join(plan.pieces),
        "logprobs": None,
        "finish_reason": plan.finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    return _encode(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(plan, completion_tokens),
        }
    )
