"""A test engine that packs tokens into SSE events the way a busy vLLM API server does.

Written from vLLM's OpenAI wire format, apart from the product's simulator: `/v1/chat/completions`
(streamed or not; `stream_options.include_usage` adds the final `choices: []` usage chunk) and
`/tokenize` (`{"prompt", "add_special_tokens"}` -> `{"count", "max_model_len", "tokens"}`).
Its answer to a conversation is a deterministic text (the same on every engine of this kind),
and each SSE event carries 1-4 tokens chosen at random per event (vLLM's engine running ahead of
its API server's stream), so two engines stream identical texts in different numbers of events.
Its usage is honest: `completion_tokens` counts the generated ids, the text's tokens plus the
EOS id when the answer stopped by itself (which re-tokenized text does not show).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from typing import Any

import msgspec
import xxhash
from aiohttp import web

_PIECE = re.compile(r"\s*\S+")  # one token: a word with its leading space
_WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "tau", "rho", "mu")
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


def tokenize(text: str) -> list[int]:
    """The engine's tokenizer: one id per word with its leading space."""
    return [xxhash.xxh32_intdigest(p.encode()) % 32000 for p in _PIECE.findall(text)]


def answer_for(messages: list[dict[str, Any]], max_tokens: int) -> tuple[list[str], str]:
    """(pieces, finish reason): a deterministic answer of 5-60 tokens to the conversation."""
    seed = xxhash.xxh64_intdigest(_encode(messages))
    n = 5 + seed % 56
    pieces = [
        (" " if i else "") + _WORDS[(seed >> (i % 48)) % len(_WORDS)] + str(i % 7) for i in range(n)
    ]
    if n > max_tokens:
        return pieces[:max_tokens], "length"
    return pieces, "stop"


class PackingEngine:
    """One engine's state: requests served, and the event packing it used."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.events = 0
        self.tokens = 0
        self.tokenize_calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        body = _decode(await request.read())
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return web.json_response({"error": {"message": "prompt required"}}, status=400)
        ids = tokenize(prompt)
        return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = _decode(await request.read())
        pieces, finish = answer_for(body["messages"], int(body.get("max_tokens") or 1 << 20))
        generated = len(pieces) + (1 if finish == "stop" else 0)  # the EOS id is generated
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": generated,
            "total_tokens": 10 + generated,
        }
        rid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body["model"]
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(pieces)}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        def event(delta: dict[str, Any], finish_reason: str | None) -> bytes:
            chunk = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            return b"data: " + _encode(chunk) + b"\n\n"

        await resp.write(event({"role": "assistant", "content": ""}, None))
        i = 0
        while i < len(pieces):
            k = self.rng.randint(1, 4)  # tokens the engine produced since the last event
            await asyncio.sleep(0.001 * k)  # their decode time
            text = "".join(pieces[i : i + k])
            i += k
            self.events += 1
            self.tokens += len(pieces[i - k : i])
            await resp.write(event({"content": text}, finish if i >= len(pieces) else None))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            chunk = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + _encode(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
