"""The simulator's `POST /v1/responses`: the OpenAI Responses API as vLLM serves it.

The request's `instructions` and `input` (a string, or message, `function_call` and
`function_call_output` items) are rendered like a chat, planned by the same pure engine, and
played out by the chat route's loop (`generate._run`: queue, prefill, one decode step a token).
A streamed answer is vLLM's event sequence, each event framed `event: <type>` then `data: <json>`
with its `sequence_number`, and no `[DONE]`: `response.created`, `response.in_progress`, then a
text answer's `output_item.added` (message), `content_part.added`, `output_text.delta`s,
`output_text.done`, `content_part.done`, `output_item.done`, or per function call its
`output_item.added` (function_call), `function_call_arguments.delta`s, `.done` and
`output_item.done`; at last `response.completed` (or `response.incomplete`, reason
`max_output_tokens`) with the whole response and its usage. Parallel calls are the engine's
(`gateway.sim.calls`), unless `parallel_tool_calls` is false. `previous_response_id` is
answered 404, as vLLM does without its response store. No logging.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta

from gateway.sim import generate
from gateway.sim.calls import ToolSpec
from gateway.sim.engine import Call, Plan, chat_segments, session_of_text
from gateway.sim.faults import SSE_HEADERS, json_error, replace_answer
from gateway.sim.state import SimState

_encode = msgspec.json.Encoder().encode


class _Part(msgspec.Struct):
    type: str = "input_text"
    text: str | None = None


class _Item(msgspec.Struct):
    type: str = "message"
    role: str = ""
    content: str | list[_Part] | None = None
    name: str = ""
    arguments: str = ""
    call_id: str = ""
    output: str | list[_Part] | None = None

    def turn(self) -> tuple[str, str] | None:
        """(role, text) as the chat template sees this item; None for a kind it ignores."""
        if self.type == "message":
            return self.role, _text(self.content)
        if self.type == "function_call":
            return "assistant", _encode({"name": self.name, "arguments": self.arguments}).decode()
        if self.type == "function_call_output":
            return "tool", _text(self.output)
        return None


def _text(content: str | list[_Part] | None) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if p.text is not None else f"<{p.type}>" for p in content or ())


class _Tool(msgspec.Struct):
    type: str = "function"
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _NamedChoice(msgspec.Struct):
    type: str = "function"
    name: str = ""


class ResponsesRequest(msgspec.Struct):
    input: str | list[_Item]
    model: str | None = None
    instructions: str | None = None
    stream: bool | None = False
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0)] | None = None
    seed: int | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | _NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None


_REQUEST = msgspec.json.Decoder(ResponsesRequest)


class _Answer:
    """The events of one answer, numbered as they are made."""

    __slots__ = ("args", "base", "msg_id", "plan", "seq")

    def __init__(self, plan: Plan, base: dict[str, Any]) -> None:
        self.plan, self.base, self.seq = plan, base, 0
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.args = plan.arguments()  # each call's arguments, whole

    def event(self, kind: str, **fields: Any) -> bytes:
        fields["sequence_number"] = self.seq
        fields["type"] = kind
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(fields) + b"\n\n"

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [_output_text(text)]
        return {
            "id": self.msg_id, "type": "message", "role": "assistant", "status": status,
            "content": content,
        }  # fmt: skip

    def call(self, index: int, status: str) -> dict[str, Any]:
        call = self.plan.calls[index]
        return {
            "type": "function_call", "id": _item_id(call), "call_id": call.id,
            "name": call.name, "arguments": "" if status == "in_progress" else self.args[index],
            "status": status,
        }  # fmt: skip

    def output(self) -> list[dict[str, Any]]:
        if self.plan.calls:
            return [self.call(i, "completed") for i in range(len(self.plan.calls))]
        return [self.message("".join(self.plan.pieces), "completed")]

    def response(self, status: str, *, final: bool) -> dict[str, Any]:
        plan = self.plan
        obj = {**self.base, "status": status, "output": self.output() if final else []}
        if final:
            if status == "incomplete":
                obj["incomplete_details"] = {"reason": "max_output_tokens"}
            obj["usage"] = {
                "input_tokens": plan.prompt_tokens,
                "input_tokens_details": {"cached_tokens": plan.cached_tokens},
                "output_tokens": plan.steps,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": plan.prompt_tokens + plan.steps,
            }
        return obj

    def status(self) -> str:
        return "completed" if self.plan.eos else "incomplete"

    def delta(self, index: int | None, piece: str) -> bytes:
        """The delta event of `piece`: call `index`'s arguments, or (None) the message's text."""
        if index is not None:
            return self.event(
                "response.function_call_arguments.delta", item_id=_item_id(self.plan.calls[index]),
                output_index=index, delta=piece,
            )  # fmt: skip
        return self.event(
            "response.output_text.delta", item_id=self.msg_id, output_index=0, content_index=0,
            delta=piece, logprobs=[],
        )  # fmt: skip

    def call_done(self, index: int) -> bytes:
        call = self.plan.calls[index]
        done = self.event(
            "response.function_call_arguments.done", item_id=_item_id(call), output_index=index,
            name=call.name, arguments=self.args[index],
        )  # fmt: skip
        item = self.call(index, "completed")
        return done + self.event("response.output_item.done", output_index=index, item=item)

    def text_done(self) -> bytes:
        text = "".join(self.plan.pieces)
        out = self.event(
            "response.output_text.done", item_id=self.msg_id, output_index=0, content_index=0,
            text=text, logprobs=[],
        )  # fmt: skip
        out += self.event(
            "response.content_part.done", item_id=self.msg_id, output_index=0, content_index=0,
            part=_output_text(text),
        )  # fmt: skip
        item = self.message(text, "completed")
        return out + self.event("response.output_item.done", output_index=0, item=item)


def _item_id(call: Call) -> str:
    return "fc_" + call.id.removeprefix("call_")


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def responses(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    if (faulted := await replace_answer(request, st)) is not None:
        return faulted
    try:
        req = _REQUEST.decode(body)
    except msgspec.DecodeError as exc:
        return json_error(400, f"Invalid request body: {exc}")
    model = generate.served_model(st, req.model)
    if isinstance(model, web.Response):
        return model
    if req.previous_response_id is not None:
        return json_error(
            404, f"Response with id '{req.previous_response_id}' not found.", "NotFoundError"
        )
    turns = [("system", req.instructions)] if req.instructions else []
    items = [_Item(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    turns += [t for item in items if (t := item.turn()) is not None]
    if not any(role != "system" for role, _ in turns):
        return json_error(400, "input must not be empty")
    tools = [ToolSpec(t.name, t.parameters) for t in req.tools or () if t.type == "function"]
    choice, named = req.tool_choice, None
    if isinstance(choice, _NamedChoice):
        named, choice = choice.name, "required"
        if named not in {t.name for t in tools}:
            return json_error(400, f"tool_choice names `{named}`, which is not in tools")
    declared = [msgspec.structs.asdict(t) for t in req.tools or ()]
    tools_text = _encode(declared).decode() if tools else None
    first_user = next((text for role, text in turns if role == "user"), turns[-1][1])
    session = request.headers.get("X-Session-ID") or req.user or session_of_text(first_user)
    entry["session"] = session
    segments = chat_segments(turns, tools_text)
    prompt = "".join(segments)
    plan = st.engine.plan(
        prompt,
        prompt_ids=st.engine.tokens.tokenize(segments),
        session=session,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        seed=req.seed,
        tools=tools,
        tool_choice=choice,
        named_tool=named,
        parallel_tool_calls=req.parallel_tool_calls is not False,
    )
    if (too_long := generate._check_length(st, plan, req.max_output_tokens)) is not None:
        return too_long
    base = {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
        "model": model, "instructions": req.instructions, "incomplete_details": None,
        "error": None, "metadata": {}, "output": [], "parallel_tool_calls": True,
        "temperature": req.temperature, "tool_choice": "auto", "top_p": None,
        "tools": declared, "usage": None,
        "max_output_tokens": req.max_output_tokens, "previous_response_id": None,
        "store": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "user": req.user,
    }  # fmt: skip
    answer = _Answer(plan, base)
    if not req.stream:
        if not await generate._run(request, st, plan, None):
            return web.Response()
        obj = answer.response(answer.status(), final=True)
        return web.Response(body=_encode(obj), content_type="application/json")
    return await _stream(request, st, answer)


async def _stream(request: web.Request, st: SimState, answer: _Answer) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    plan = answer.plan
    for kind in ("response.created", "response.in_progress"):
        await resp.write(answer.event(kind, response=answer.response("in_progress", final=False)))
    # Per decode step: (call index, argument piece, or None for the step announcing the call),
    # or (None, text piece) for a text answer.
    steps: list[tuple[int | None, str | None]] = (
        list(plan.schedule) if plan.calls else [(None, p) for p in plan.pieces]
    )
    last = len(steps) - 1
    heads = [i for i, (_, piece) in enumerate(steps) if piece is None]
    flush_at = generate._event_ends(st.profile.max_tokens_per_event, 0, last)
    flush_at |= {h - 1 for h in heads}  # an event never spans two calls
    held: list[str] = []  # pieces decoded but not yet sent: the API server is behind

    async def emit(step: int) -> None:
        out = b""
        if step == 0 and not plan.calls:
            item = answer.message("", "in_progress")
            out += answer.event("response.output_item.added", output_index=0, item=item)
            out += answer.event(
                "response.content_part.added", item_id=answer.msg_id, output_index=0,
                content_index=0, part=_output_text(""),
            )  # fmt: skip
        if step <= last:
            index, piece = steps[step]
            if piece is None:  # a call begins: the previous one is done
                assert index is not None
                if index:
                    out += answer.call_done(index - 1)
                item = answer.call(index, "in_progress")
                out += answer.event("response.output_item.added", output_index=index, item=item)
            else:
                held.append(piece)
                if step in flush_at:
                    out += answer.delta(index, "".join(held))
                    held.clear()
        if out:
            await resp.write(out)

    if not await generate._run(request, st, plan, emit):
        return resp
    with contextlib.suppress(ConnectionError):
        out = answer.call_done(len(plan.calls) - 1) if plan.calls else answer.text_done()
        status = answer.status()
        out += answer.event(f"response.{status}", response=answer.response(status, final=True))
        await resp.write(out)
        await resp.write_eof()
    return resp
