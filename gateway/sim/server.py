"""The simulator's aiohttp application and a handle to run one on a real socket.

Routes are vLLM's: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/responses`
(gateway/sim/responses.py), `/v1/embeddings`,
`/tokenize`, `/health`; plus the simulator's own `/sim/stats`, `/sim/requests` and `/sim/reset`
for tests. Every request outside `/sim/` is counted and kept in a bounded log (method, path,
headers, body length, session) so proxy tests can check what was forwarded. No per-request
logging, no access log.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from gateway.sim import generate, protocol, responses
from gateway.sim.engine import chat_segments, embed, tokenize
from gateway.sim.faults import MAX_BODY_BYTES, json_error, read_body, replace_answer
from gateway.sim.profiles import SimProfile, get_profile
from gateway.sim.state import STATE, ClientGone, SimState, pause

_encode = msgspec.json.Encoder().encode
_EMBEDDING = msgspec.json.Decoder(protocol.EmbeddingRequest)
_TOKENIZE = msgspec.json.Decoder(protocol.TokenizeRequest)
_SHUTDOWN_TIMEOUT_S = 0.5  # in-flight generations (and hung ones) are cut after this on close

Handler = Callable[[web.Request, SimState, bytes, dict[str, Any]], Awaitable[web.StreamResponse]]


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=status, content_type="application/json")


def _observed(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Count the request, log it (bounded), read its body, then call the route."""

    async def route(request: web.Request) -> web.StreamResponse:
        st = request.app[STATE]
        st.stats.requests += 1
        headers: dict[str, str] = {}
        for key, value in request.headers.items():
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        entry: dict[str, Any] = {
            "method": request.method,
            "path": request.path,
            "headers": headers,
            "body_len": 0,
            "session": None,
        }
        st.log.append(entry)
        body = await read_body(request, st) if request.can_read_body else b""
        entry["body_len"] = len(body)
        return await handler(request, st, body, entry)

    return route


async def _models(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    created = int(time.time())
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": st.profile.max_model_len,
        }
        for name in st.profile.served_model_names
    ]
    return _json({"object": "list", "data": cards})


async def _health(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    return web.Response()


async def _tokenize(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    try:
        req = _TOKENIZE.decode(body)
    except msgspec.DecodeError as exc:
        return json_error(400, f"Invalid request body: {exc}")
    if (req.prompt is None) == (req.messages is None):
        return json_error(400, "give exactly one of `prompt` or `messages`")
    if req.messages is not None:
        segments = chat_segments(
            [(m.role, m.text()) for m in req.messages],
            continue_final=req.continue_final_message,
        )
        tokens = st.engine.tokens.tokenize(segments)
    else:
        tokens = tokenize(req.prompt or "")
    max_len = st.profile.max_model_len
    return _json(
        {"count": len(tokens), "max_model_len": max_len, "tokens": tokens, "token_strs": None}
    )


async def _embeddings(
    request: web.Request, st: SimState, body: bytes, entry: dict[str, Any]
) -> web.StreamResponse:
    if (faulted := await replace_answer(request, st)) is not None:
        return faulted
    try:
        req = _EMBEDDING.decode(body)
    except msgspec.DecodeError as exc:
        return json_error(400, f"Invalid request body: {exc}")
    model = generate.served_model(st, req.model)
    if isinstance(model, web.Response):
        return model
    raw = [req.input] if isinstance(req.input, str) or _is_token_list(req.input) else req.input
    if not raw:
        return json_error(400, "input must not be empty")
    texts = [item if isinstance(item, str) else " ".join(map(str, item)) for item in raw]
    prompt_tokens = sum(len(tokenize(t)) for t in texts)
    try:
        await pause(request, st.engine.prefill_delay(prompt_tokens))
    except ClientGone:
        st.stats.aborted += 1
        return web.Response()
    data = []
    for index, text in enumerate(texts):
        vector = embed(text)
        value: Any = vector
        if req.encoding_format == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": index, "object": "embedding", "embedding": value})
    st.stats.completed += 1
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0}
    return _json(
        {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage,
        }
    )


def _is_token_list(value: list[Any]) -> bool:
    return bool(value) and all(isinstance(v, int) for v in value)


async def _stats(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    tokens = st.engine.tokens
    return _json(
        {
            **st.stats.as_dict(),
            "token_cache_hits": tokens.hits,
            "token_cache_misses": tokens.misses,
            "token_cache_evicted": tokens.evicted,  # messages dropped for the bound
        }
    )


async def _requests(request: web.Request) -> web.StreamResponse:
    return _json(list(request.app[STATE].log))


async def _reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE].reset()
    return _json({"reset": True})


def build_sim_app(profile: SimProfile, *, seed: int = 0) -> web.Application:
    """An aiohttp Application serving one simulated engine with `profile`."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE] = SimState(profile, seed)
    app.router.add_get("/v1/models", _observed(_models))
    app.router.add_post("/v1/chat/completions", _observed(generate.chat))
    app.router.add_post("/v1/completions", _observed(generate.completions))
    app.router.add_post("/v1/responses", _observed(responses.responses))
    app.router.add_post("/v1/embeddings", _observed(_embeddings))
    app.router.add_post("/tokenize", _observed(_tokenize))
    app.router.add_get("/health", _observed(_health))
    app.router.add_get("/sim/stats", _stats)
    app.router.add_get("/sim/requests", _requests)
    app.router.add_post("/sim/reset", _reset)
    return app


class SimServer:
    """A simulator running on a real socket; `close()` stops it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, profile: SimProfile) -> None:
        self._runner = runner
        self.host = host
        self.port = port
        self.profile = profile
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def app(self) -> web.Application:
        return self._runner.app

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> SimServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_sim(
    profile: SimProfile | str, *, host: str = "127.0.0.1", port: int = 0, seed: int = 0
) -> SimServer:
    """Start a simulator on host:port (0 = any free port) and return its handle."""
    if isinstance(profile, str):
        profile = get_profile(profile)
    runner = web.AppRunner(
        build_sim_app(profile, seed=seed),
        access_log=None,
        handler_cancellation=True,  # a client that leaves stops its generation at once
        shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = int(runner.addresses[0][1])
    except BaseException:
        await runner.cleanup()
        raise
    return SimServer(runner, host, bound_port, profile)
