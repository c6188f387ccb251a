"""The generation routes: `POST /v1/chat/completions` and `POST /v1/completions`.

Each request is decoded once, turned into a `Plan` by the pure engine, then played out: queue
for a batch slot, sleep the prefill, then one decode step per token, writing one SSE event per
token when streaming. The `reset-mid-stream` and `slow-drip` faults act here because they need
the loop's timing. Nothing here logs; every outcome is a counter in `SimStats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from gateway.sim import protocol
from gateway.sim.calls import ToolSpec
from gateway.sim.engine import Plan, chat_segments, prompt_logprobs, session_of_text
from gateway.sim.faults import SSE_HEADERS, json_error, replace_answer, reset_connection
from gateway.sim.grader import VERDICT_SCHEMA, verdict_text
from gateway.sim.state import ClientGone, SimState, pause

_encode = msgspec.json.Encoder().encode
_CHAT = msgspec.json.Decoder(protocol.ChatRequest)
_COMPLETION = msgspec.json.Decoder(protocol.CompletionRequest)


def served_model(st: SimState, requested: str | None) -> str | web.Response:
    names = st.profile.served_model_names
    if requested is None or requested == "":
        return names[0]
    if requested in names:
        return requested
    return json_error(404, f"The model `{requested}` does not exist.", "NotFoundError")


def _check_length(st: SimState, plan: Plan, max_tokens: int | None) -> web.Response | None:
    limit = st.profile.max_model_len
    need = plan.prompt_tokens + (max_tokens or 0)
    if need > limit or plan.prompt_tokens >= limit:
        return json_error(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{need} tokens ({plan.prompt_tokens} in the messages, {max_tokens or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    return None


Emit = Callable[[int], Awaitable[None]]


async def _run(request: web.Request, st: SimState, plan: Plan, emit: Emit | None) -> bool:
    """Queue for a slot, prefill, decode `plan.steps` tokens calling `emit(step)` for each.

    Returns False when the client went away (counted) or the profile reset the connection.
    """
    profile, engine = st.profile, st.engine
    drip = st.scaled(profile.slow_drip_s_per_chunk) if profile.fault == "slow-drip" else None
    reset_at = 2 if profile.fault == "reset-mid-stream" and emit is not None else -1
    done = 0
    async with st.slots:
        st.enter()
        try:
            prefill = engine.prefill_delay(plan.uncached_tokens) if drip is None else drip
            await pause(request, prefill)
            for step in range(plan.steps):
                if step:
                    others = st.stats.active - 1
                    await pause(request, drip if drip is not None else engine.decode_delay(others))
                if emit is not None:
                    await emit(step)
                done = step + 1
                if step == reset_at:
                    st.stats.faulted += 1
                    await reset_connection(request)
                    return False
        except asyncio.CancelledError:
            st.stats.aborted += 1
            raise
        except (ClientGone, ConnectionError):
            st.stats.aborted += 1
            return False
        finally:
            st.stats.active -= 1
            engine.finish(plan, done)
    st.stats.completed += 1
    return True


async def _respond(
    request: web.Request,
    st: SimState,
    plan: Plan,
    *,
    chat: bool,
    model: str,
    stream: bool,
    include_usage: bool,
) -> web.StreamResponse:
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    if not stream:
        if not await _run(request, st, plan, None):
            return web.Response()
        build = protocol.chat_completion if chat else protocol.text_completion
        body = build(plan, request_id, created, model, plan.steps)
        if st.profile.fault != "reset-mid-stream":
            return web.Response(body=body, content_type="application/json")
        st.stats.faulted += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        await reset_connection(request)
        return resp

    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    enc = protocol.ChunkEncoder(chat=chat, request_id=request_id, created=created, model=model)
    emit = (
        _call_emitter(resp, enc, plan, st)
        if plan.calls
        else _text_emitter(resp, enc, plan, st, chat)
    )
    if not await _run(request, st, plan, emit):
        return resp
    with contextlib.suppress(ConnectionError):
        if include_usage:
            await resp.write(enc.usage(plan, plan.steps))
        await resp.write(protocol.DONE)
        await resp.write_eof()
    return resp


def _text_emitter(
    resp: web.StreamResponse,
    enc: protocol.ChunkEncoder,
    plan: Plan,
    st: SimState,
    chat: bool,
) -> Emit:
    """Write a text answer's step: the role first (chat), then its pieces, packed into events
    as `_event_ends` says, then the finish."""
    pieces, last = plan.pieces, len(plan.pieces) - 1
    cut = None if plan.eos else "length"
    flush_at = _event_ends(st.profile.max_tokens_per_event, 0, last)
    held: list[str] = []  # pieces decoded but not yet sent: the API server is behind

    async def emit(step: int) -> None:
        if step == 0 and chat:
            await resp.write(enc.role())
        if step <= last:
            held.append(pieces[step])
            if step not in flush_at:
                return
            piece = "".join(held)
            held.clear()
            await resp.write(enc.token(piece, cut if step == last else None))
        else:
            await resp.write(enc.end(plan.finish_reason))

    return emit


def _call_emitter(
    resp: web.StreamResponse, enc: protocol.ChunkEncoder, plan: Plan, st: SimState
) -> Emit:
    """Write a call answer's step, as vLLM's tool parsers stream: the role, then per call one
    event with its index, id and name, then its argument fragments (packed as `_event_ends`
    says, never across two calls), then the next call; the finish last."""
    schedule, calls, last = plan.schedule, plan.calls, len(plan.schedule) - 1
    cut = None if plan.eos else "length"
    heads = [i for i, (_, piece) in enumerate(schedule) if piece is None]
    flush_at = _event_ends(st.profile.max_tokens_per_event, 0, last) | {h - 1 for h in heads}
    held: list[str] = []

    async def emit(step: int) -> None:
        if step == 0:
            await resp.write(enc.role())
        if step > last:
            await resp.write(enc.end(plan.finish_reason))
            return
        index, piece = schedule[step]
        if piece is None:
            call = calls[index]
            await resp.write(enc.tool_call(index, call.id, call.name))
            if step == last and cut is not None:  # max_tokens left no room for arguments
                await resp.write(enc.tool_arguments(index, "", cut))
            return
        held.append(piece)
        if step in flush_at:
            fragment = "".join(held)
            held.clear()
            await resp.write(enc.tool_arguments(index, fragment, cut if step == last else None))

    return emit


def _event_ends(max_per_event: int, first: int, last: int) -> frozenset[int]:
    """The decode steps after which an SSE event is sent: every step (one token per event), or
    after 1..max_per_event steps at random, as vLLM's API server sends what its engine decoded
    since the last event when it runs behind (how far behind depends on load: random here)."""
    if max_per_event <= 1:
        return frozenset(range(first, last + 1))
    ends, step = {last}, first - 1
    while step < last:
        step += random.randint(1, max_per_event)  # timing noise, not a secret
        ends.add(min(step, last))
    return frozenset(ends)


def _max_tokens(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


async def chat(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    if (faulted := await replace_answer(request, st)) is not None:
        return faulted
    try:
        req = _CHAT.decode(body)
    except msgspec.DecodeError as exc:
        return json_error(400, f"Invalid request body: {exc}")
    model = served_model(st, req.model)
    if isinstance(model, web.Response):
        return model
    if not req.messages or req.n not in (None, 1):
        return json_error(400, "messages must not be empty and n must be 1 in the simulator")
    tools = [ToolSpec(t.function.name, t.function.parameters) for t in req.tools or ()]
    choice, named = req.tool_choice, None
    if isinstance(choice, protocol.NamedToolChoice):
        named, choice = choice.function.name, "required"
        if named not in {t.name for t in tools}:
            return json_error(400, f"tool_choice names `{named}`, which is not in tools")
    tools_text = _encode([t.function for t in req.tools]).decode() if req.tools else None
    messages = [(m.role, m.text()) for m in req.messages]
    first_user = next((text for role, text in messages if role == "user"), messages[0][1])
    session = request.headers.get("X-Session-ID") or req.user or session_of_text(first_user)
    entry["session"] = session
    max_tokens = _max_tokens(req.max_completion_tokens, req.max_tokens)
    fmt = req.response_format.type if req.response_format else "text"
    schema = req.response_format.json_schema if req.response_format else None
    segments = chat_segments(messages, tools_text)
    prompt = "".join(segments)
    is_verdict = schema is not None and schema.name == VERDICT_SCHEMA
    plan = st.engine.plan(
        prompt,
        prompt_ids=st.engine.tokens.tokenize(segments),
        session=session,
        max_tokens=max_tokens,
        temperature=req.temperature,
        seed=req.seed,
        json_mode=fmt in ("json_object", "json_schema"),
        tools=tools,
        tool_choice=choice,
        named_tool=named,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        answer=verdict_text(st.engine.profile, prompt) if is_verdict else None,
    )
    if (too_long := _check_length(st, plan, max_tokens)) is not None:
        return too_long
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _respond(
        request, st, plan, chat=True, model=model, stream=bool(req.stream), include_usage=usage
    )


async def completions(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    if (faulted := await replace_answer(request, st)) is not None:
        return faulted
    try:
        req = _COMPLETION.decode(body)
    except msgspec.DecodeError as exc:
        return json_error(400, f"Invalid request body: {exc}")
    model = served_model(st, req.model)
    if isinstance(model, web.Response):
        return model
    if req.prompt_logprobs is not None:
        return await _score(request, st, req, model)
    prompt = req.prompt
    if isinstance(prompt, list):
        if not prompt or (all(isinstance(p, str) for p in prompt) and len(prompt) > 1):
            return json_error(400, "the simulator takes one prompt per request")
        prompt = " ".join(str(p) for p in prompt)  # token ids: one piece per id
    if req.n not in (None, 1):
        return json_error(400, "n must be 1 in the simulator")
    session = request.headers.get("X-Session-ID") or req.user or session_of_text(prompt[:256])
    entry["session"] = session
    plan = st.engine.plan(
        prompt,
        session=session,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        seed=req.seed,
    )
    if (too_long := _check_length(st, plan, req.max_tokens)) is not None:
        return too_long
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _respond(
        request, st, plan, chat=False, model=model, stream=bool(req.stream), include_usage=usage
    )


async def _score(
    request: web.Request, st: SimState, req: protocol.CompletionRequest, model: str
) -> web.StreamResponse:
    """Prompt logprobs of a prompt of token ids (a scoring copy): one prefill, no answer."""
    profile = st.profile
    k = req.prompt_logprobs or 0
    if not profile.prompt_logprobs:
        return json_error(400, "prompt_logprobs is not supported by this engine")
    if not 0 <= k <= profile.max_logprobs:
        return json_error(
            400,
            f"Requested prompt logprobs of {k}, which is greater than max "
            f"allowed: {profile.max_logprobs}",
        )
    if req.stream:
        return json_error(400, "prompt_logprobs is not compatible with streaming")
    ids = req.prompt
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return json_error(400, "the simulator scores prompts of token ids")
    token_ids = [int(t) for t in ids]
    await pause(request, profile.prefill_s_per_token * len(token_ids) * profile.time_scale)
    st.stats.scored += 1
    st.stats.scored_tokens += len(token_ids)
    body = {
        "id": "cmpl-score",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": "length",
                "prompt_logprobs": prompt_logprobs(token_ids, k, profile.logprob_shift),
            }
        ],
        "usage": {
            "prompt_tokens": len(token_ids),
            "completion_tokens": 1,
            "total_tokens": len(token_ids) + 1,
        },
    }
    return web.Response(body=_encode(body), content_type="application/json")
