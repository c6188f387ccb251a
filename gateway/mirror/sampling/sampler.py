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
A Responses API request (`/v1/responses`) carries its history in `input` (a string, or a list
of items) and its system prompt in `instructions`: its fallback key is (model, instructions or
the first system item, first user item), and a string `input` is that first user message, so a
conversation's later turns (a list) keep its first turn's key. A Responses request that names
state kept on the server (`previous_response_id`, `conversation`) is never mirrored: the
candidate never produced that response (`RequestView.server_state`; the mirror counts it as
skipped, `unmirrorable_state`).

The body is decoded with Structs that declare only what sampling and the exchange record need;
message contents stay `msgspec.Raw` (never decoded) except the two that feed the fallback key.
`Offer` and `decide` are the one sampling decision: the worker (`gateway.mirror.channel.handoff`)
takes
it on the request path from the request id and the session header; when a session-mode candidate
needs a key only the body holds, the worker hands the request off undecided and the mirror process
(`gateway.mirror.tee`) parses the body and takes the same decision with the same function.

This module must never copy a body, log, or import the event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec
import xxhash

from domain.endpoint import Endpoint
from gateway.mirror.sampling.rate import endpoint_rate

__all__ = [
    "MIRRORED_ROUTES",
    "SALT",
    "Offer",
    "RequestView",
    "apply_capacity",
    "decide",
    "decide_kept",
    "hash_key",
    "is_sampled",
    "mirrored_route",
    "offers_for",
    "parse_request",
    "session_key",
    "threshold_for",
    "turn_index",
]

# Routes whose POST bodies are mirrored; anything else is forwarded only.
MIRRORED_ROUTES: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
)

_TWO_64: Final = float(2**64)
_LIST: Final = 0x5B  # "[": a JSON array
_STRING: Final = 0x22  # '"': a JSON string
_NULL: Final = msgspec.Raw(b"null")
_SEP: Final = b"\x00"


class Message(msgspec.Struct):
    """One chat message: its role, and its content left undecoded."""

    role: str = ""
    content: msgspec.Raw = _NULL


class InputItem(msgspec.Struct):
    """One item of a Responses `input` list: a message (`type` omitted or "message", a role and
    its content left undecoded), a `function_call`, a `function_call_output`, or another kind."""

    type: str = "message"
    role: str = ""
    content: msgspec.Raw = _NULL


class ResponseFormat(msgspec.Struct):
    type: str = ""


class RequestView(msgspec.Struct):
    """The few fields of an OpenAI request body that sampling and the exchange record use."""

    model: str | None = None
    messages: list[Message] | None = None
    prompt: msgspec.Raw = _NULL
    input: msgspec.Raw = _NULL  # /v1/embeddings, /v1/responses (a string or a list of items)
    user: str | None = None
    stream: bool | None = None
    temperature: float | None = None
    response_format: ResponseFormat | None = None
    tools: list[msgspec.Raw] | None = None
    # Left undecoded: only the mirror's tool-call check (gateway.mirror.toolcalls) reads them.
    tool_choice: msgspec.Raw = _NULL
    parallel_tool_calls: bool | None = None
    # The Responses API: its system prompt, and the state it asks the server to continue.
    instructions: msgspec.Raw = _NULL
    previous_response_id: str | None = None
    conversation: msgspec.Raw = _NULL

    @property
    def json_requested(self) -> bool:
        rf = self.response_format
        return rf is not None and rf.type in ("json_object", "json_schema")

    @property
    def tools_requested(self) -> bool:
        return bool(self.tools)

    @property
    def server_state(self) -> bool:
        """True when the request continues state only the server that answered before holds
        (a Responses `previous_response_id` or `conversation`): a copy cannot be replayed."""
        return self.previous_response_id is not None or self.conversation != _NULL

    def input_items(self) -> list[InputItem] | None:
        """The Responses `input` as a list of items; None when it is not one (a string, an
        embeddings input of strings or token ids, or absent)."""
        raw = self.input
        if _lead(raw) != _LIST:
            return None
        try:
            return _decode_items(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None


_decode_view = msgspec.json.Decoder(RequestView).decode
_decode_items = msgspec.json.Decoder(list[InputItem]).decode
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


class Offer:
    """One candidate that receives copies, as the sampling decision sees it: its share in force
    (`rate`, set from its `sample_rate` or its `target_rps` and the references) and the hash
    threshold of that share. The adaptive controller (`gateway.mirror.sampling.adaptive`) may change
    `rate` and `threshold` in place. `keep` is the threshold of the copies kept under the
    mirror's capacity share (`gateway.mirror.sampling.capacity`), `low` that of the lowest share
    of the last while: equal to `threshold` while no capacity limit holds."""

    __slots__ = ("endpoint", "keep", "low", "name", "rate", "session_mode", "threshold")

    def __init__(self, endpoint: Endpoint, refs: tuple[float, float]) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.rate = endpoint_rate(endpoint, refs)
        self.threshold = self.keep = self.low = threshold_for(self.rate)
        self.session_mode = endpoint.sampling == "session"


def offers_for(endpoints: Iterable[Endpoint], refs: tuple[float, float]) -> tuple[Offer, ...]:
    """The offers of the candidates that receive copies: active, with a positive sample rate."""
    return tuple(
        Offer(e, refs)
        for e in endpoints
        if e.role == "candidate" and e.state == "active" and e.sample_rate > 0
    )


def decide(
    offers: Sequence[Offer], request_key: bytes, session: bytes | None
) -> tuple[list[Offer], bool]:
    """The offers this request is sampled for, and whether any stays undecided.

    A request-mode offer is keyed by `request_key` (the request id), a session-mode offer by
    `session`; with `session` None a session-mode offer is left undecided (the key is in the
    body) and the second value is True. One xxh3 per decided offer; nothing is parsed."""
    chosen: list[Offer] = []
    undecided = False
    for offer in offers:
        key = session if offer.session_mode else request_key
        if key is None:  # a session-mode offer whose key is in the body
            undecided = True
            continue
        if xxhash.xxh3_64_intdigest(SALT + key) < offer.threshold:
            chosen.append(offer)
    return chosen, undecided


def apply_capacity(offers: Iterable[Offer], caps: Mapping[str, tuple[float, float]]) -> None:
    """Set each offer's `keep` and `low` from its capacity (share, low) pair (absent: none)."""
    for offer in offers:
        cap = caps.get(offer.name)
        if cap is None:
            offer.keep = offer.low = offer.threshold
        else:
            offer.keep = min(offer.threshold, threshold_for(cap[0]))
            offer.low = min(offer.keep, threshold_for(cap[1]))


def decide_kept(
    offers: Sequence[Offer], request_key: bytes, session: bytes | None, first_turn: bool
) -> tuple[list[Offer], list[Offer], list[Offer], bool]:
    """`decide` under the capacity shares: (kept, shed, check, undecided).

    A sampled copy (`hash < threshold`) is kept when `hash < keep`, else shed, except a later
    turn (`first_turn` False) of a session-mode offer whose hash lies in `[low, threshold)`: its
    session may have been admitted when the share was higher, or shed when it was lower, so it
    is in `check` (the mirror process answers from the sessions it admitted). Nested: `keep`
    never exceeds `threshold`, so the kept copies are a subset of the sample."""
    kept: list[Offer] = []
    shed: list[Offer] = []
    check: list[Offer] = []
    undecided = False
    for offer in offers:
        key = session if offer.session_mode else request_key
        if key is None:  # a session-mode offer whose key is in the body
            undecided = True
            continue
        h = xxhash.xxh3_64_intdigest(SALT + key)
        if h >= offer.threshold:
            continue
        if offer.session_mode and not first_turn and h >= offer.low:
            check.append(offer)
        elif h < offer.keep:
            kept.append(offer)
        else:
            shed.append(offer)
    return kept, shed, check, undecided


def _lead(raw: msgspec.Raw) -> int:
    """The first byte of an undecoded value (msgspec strips the whitespace before it)."""
    view = memoryview(raw)
    return view[0] if len(view) else 0


def _canonical(raw: msgspec.Raw) -> bytes:
    """A message content as stable bytes: the text of a string, else its re-encoded JSON."""
    value = _decode_any(raw)
    if isinstance(value, str):
        return value.encode()
    return _encode(value)


def session_key(view: RequestView, header_value: str | None) -> bytes:
    """The session sampling key: header, else `user`, else a hash of the conversation's start."""
    if header_value:  # its wire bytes, UTF-8 or not (aiohttp decodes with surrogateescape)
        return header_value.encode("utf-8", "surrogateescape")
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
    elif _lead(view.input) == _STRING or (items := view.input_items()) is not None:
        # A Responses request (or an embeddings input of one string): the chat key's parts.
        instructions = view.instructions if view.instructions != _NULL else None
        user: msgspec.Raw | None = view.input  # a string input is the first user message
        if _lead(view.input) == _LIST:
            user = None
            for item in items or ():
                if item.type != "message":
                    continue
                if instructions is None and item.role in ("system", "developer"):
                    instructions = item.content
                elif item.role == "user":
                    user = item.content
                    break
        for part in (instructions, user):
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
    """The number of assistant messages in the request (0 for a first turn or a prompt); in a
    Responses `input`, assistant `message` items and `function_call` items (each call an agent
    made is a turn it answered)."""
    if view.messages:
        return sum(1 for m in view.messages if m.role == "assistant")
    items = view.input_items()
    if not items:
        return 0
    return sum(
        1
        for item in items
        if item.type == "function_call" or (item.type == "message" and item.role == "assistant")
    )
