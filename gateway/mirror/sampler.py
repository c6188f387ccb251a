"""Deterministic sampling of production requests for candidates (pure: no IO, no asyncio).

A request is mirrored to candidate `c` iff `xxh3_64(SALT + key) / 2**64 < c.sample_rate`,
so every gateway replica decides the same way without talking to the others. Every candidate
shares the one salt, so samples are nested: candidates at the same rate receive exactly the same
requests (a `control` at the candidate's rate answers every request the candidate answers, so
each pair has its reference), and a candidate at a lower rate receives a subset of one at a
higher rate. Independent salts would leave a control and a candidate at rate r overlapping on
only r² of the traffic.

The key is the request id in `request` mode, and the session in `session` mode: the session
header (`X-Session-ID` by default), else the OpenAI `user` field, else a hash of (model, system
prompt, first user message), so a sampled conversation is mirrored turn after turn. For a
prompt-style request without a session header or `user`, the fallback key is (model, prompt).

The body is decoded with Structs that declare only what sampling and the exchange record need;
message contents stay `msgspec.Raw` (never decoded) except the two that feed the fallback key.
This module must never copy a body, log, or import the event loop.
"""

from __future__ import annotations

from typing import Final

import msgspec
import xxhash

__all__ = [
    "MIRRORED_ROUTES",
    "SALT",
    "RequestView",
    "hash_key",
    "is_sampled",
    "mirrored_route",
    "parse_request",
    "session_key",
    "threshold_for",
    "turn_index",
]

# Routes whose POST bodies are mirrored; anything else is forwarded only.
MIRRORED_ROUTES: Final = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})

_TWO_64: Final = float(2**64)
_NULL: Final = msgspec.Raw(b"null")
_SEP: Final = b"\x00"


class Message(msgspec.Struct):
    """One chat message: its role, and its content left undecoded."""

    role: str = ""
    content: msgspec.Raw = _NULL


class ResponseFormat(msgspec.Struct):
    type: str = ""


class RequestView(msgspec.Struct):
    """The few fields of an OpenAI request body that sampling and the exchange record use."""

    model: str | None = None
    messages: list[Message] | None = None
    prompt: msgspec.Raw = _NULL
    input: msgspec.Raw = _NULL  # /v1/embeddings
    user: str | None = None
    stream: bool | None = None
    temperature: float | None = None
    response_format: ResponseFormat | None = None
    tools: list[msgspec.Raw] | None = None

    @property
    def json_requested(self) -> bool:
        rf = self.response_format
        return rf is not None and rf.type in ("json_object", "json_schema")

    @property
    def tools_requested(self) -> bool:
        return bool(self.tools)


_decode_view = msgspec.json.Decoder(RequestView).decode
_decode_any = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def mirrored_route(method: str, path_qs: str) -> str | None:
    """The route (path without query) when this request may be mirrored, else None."""
    if method != "POST":
        return None
    path = path_qs.partition("?")[0]
    return path if path in MIRRORED_ROUTES else None


def parse_request(body: bytes) -> RequestView | None:
    """Decode the sampling fields of `body`; None when it is not a JSON object of that shape."""
    try:
        return _decode_view(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


SALT: Final = b"canary-gateway/sample:"


def threshold_for(sample_rate: float) -> float:
    """`rate * 2**64`, so that `hash < threshold` ⇔ `hash / 2**64 < rate` without rounding."""
    return min(max(sample_rate, 0.0), 1.0) * _TWO_64


def is_sampled(salt: bytes, key: bytes, threshold: float) -> bool:
    """The sampling decision for one (candidate, key)."""
    return xxhash.xxh3_64_intdigest(salt + key) < threshold


def _canonical(raw: msgspec.Raw) -> bytes:
    """A message content as stable bytes: the text of a string, else its re-encoded JSON."""
    value = _decode_any(raw)
    if isinstance(value, str):
        return value.encode()
    return _encode(value)


def session_key(view: RequestView, header_value: str | None) -> bytes:
    """The session sampling key: header, else `user`, else a hash of the conversation's start."""
    if header_value:
        return header_value.encode()
    if view.user:
        return view.user.encode()
    h = xxhash.xxh3_128()
    h.update((view.model or "").encode())
    if view.messages is not None:
        system = first_user = None
        for msg in view.messages:
            if system is None and msg.role in ("system", "developer"):
                system = msg.content
            elif msg.role == "user":
                first_user = msg.content
                break
        for part in (system, first_user):
            h.update(_SEP)
            if part is not None:
                h.update(_canonical(part))
    else:
        h.update(_SEP)
        h.update(bytes(view.prompt if view.prompt != _NULL else view.input))
    return h.hexdigest().encode()


def hash_key(key: bytes) -> str:
    """What is stored for a session key: a hex hash, never the raw value."""
    return xxhash.xxh3_128_hexdigest(key)


def turn_index(view: RequestView) -> int:
    """The number of assistant messages in the request (0 for a first turn or a prompt)."""
    if not view.messages:
        return 0
    return sum(1 for m in view.messages if m.role == "assistant")
