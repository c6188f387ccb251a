"""The deterministic sampler: decisions, session keys, turn index, routes (pure, no IO)."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import xxhash
from hypothesis import given

from domain.endpoint import Endpoint
from gateway.mirror.sampling.sampler import (
    SALT,
    decide,
    hash_key,
    is_sampled,
    mirrored_route,
    offers_for,
    parse_request,
    session_key,
    threshold_for,
    turn_index,
)


def _chat(*messages: tuple[str, str], **extra: object) -> bytes:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}
    return msgspec.json.encode(body)


@given(key=st.binary(max_size=64), rate=st.floats(0, 1))
def test_decision_matches_the_documented_formula(key: bytes, rate: float) -> None:
    """`is_sampled` is exactly `xxh3_64(salt + key) / 2**64 < rate` (up to float rounding)."""
    salt = SALT
    h = xxhash.xxh3_64_intdigest(salt + key)
    assert is_sampled(salt, key, threshold_for(rate)) == (h < rate * 2**64)
    assert is_sampled(salt, key, threshold_for(rate)) == is_sampled(salt, key, threshold_for(rate))


def test_rate_bounds_and_proportion() -> None:
    """Rate 0 never samples, rate 1 always does, and 0.25 samples about a quarter."""
    salt = SALT
    keys = [f"req-{i}".encode() for i in range(20_000)]
    assert not any(is_sampled(salt, k, threshold_for(0.0)) for k in keys)
    assert all(is_sampled(salt, k, threshold_for(1.0)) for k in keys)
    share = sum(is_sampled(salt, k, threshold_for(0.25)) for k in keys) / len(keys)
    assert 0.23 < share < 0.27


def test_candidates_share_nested_samples() -> None:
    """Candidates at the same rate get the same keys; a lower rate gets a subset of a higher."""
    keys = [f"req-{i}".encode() for i in range(4000)]
    half = {k for k in keys if is_sampled(SALT, k, threshold_for(0.5))}
    tenth = {k for k in keys if is_sampled(SALT, k, threshold_for(0.1))}
    assert tenth < half
    assert 0.45 < len(half) / len(keys) < 0.55


def test_session_key_precedence_header_user_conversation() -> None:
    """The session header wins over `user`, which wins over the conversation hash."""
    view = parse_request(_chat(("user", "hi"), user="alice"))
    assert view is not None
    assert session_key(view, "sess-1") == b"sess-1"
    assert session_key(view, None) == b"alice"
    anon = parse_request(_chat(("user", "hi")))
    assert anon is not None
    assert session_key(anon, None) not in (b"alice", b"")


def test_conversation_key_is_stable_across_turns() -> None:
    """Later turns of a conversation without header or user share the first turn's key."""
    t0 = _chat(("system", "be brief"), ("user", "first question"))
    t2 = _chat(
        ("system", "be brief"),
        ("user", "first question"),
        ("assistant", "answer"),
        ("user", "second"),
        ("assistant", "answer 2"),
        ("user", "third"),
    )
    other = _chat(("system", "be brief"), ("user", "another conversation"))
    v0, v2, vo = parse_request(t0), parse_request(t2), parse_request(other)
    assert v0 is not None and v2 is not None and vo is not None
    assert session_key(v0, None) == session_key(v2, None) != session_key(vo, None)
    assert (turn_index(v0), turn_index(v2)) == (0, 2)


def test_conversation_key_ignores_json_spelling() -> None:
    """Escaped and literal spellings of the same first message give the same session key."""
    literal = b'{"model":"m","messages":[{"role":"user","content":"caf\xc3\xa9"}]}'
    escaped = b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9"}]}'
    a, b = parse_request(literal), parse_request(escaped)
    assert a is not None and b is not None
    assert session_key(a, None) == session_key(b, None)


def test_prompt_and_embeddings_fallback_keys() -> None:
    """Prompt and embedding requests without a session fall back to (model, prompt/input)."""
    p1 = parse_request(b'{"model":"m","prompt":"once upon"}')
    p2 = parse_request(b'{"model":"m","prompt":"once upon"}')
    e1 = parse_request(b'{"model":"m","input":["a","b"]}')
    assert p1 is not None and p2 is not None and e1 is not None
    assert session_key(p1, None) == session_key(p2, None) != session_key(e1, None)
    assert turn_index(p1) == 0


def test_unparseable_bodies() -> None:
    """Bodies that are not a JSON object of the OpenAI shape are reported as unparseable."""
    for body in (b"", b"not json", b"[1,2]", b'{"model": 5}', b'{"messages": "x"}', b"\xff\xfe"):
        assert parse_request(body) is None


def test_request_flags() -> None:
    """JSON mode, tools, stream and temperature are read from the body."""
    view = parse_request(
        _chat(
            ("user", "x"),
            stream=True,
            temperature=0,
            response_format={"type": "json_object"},
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    )
    assert view is not None
    assert view.stream and view.temperature == 0.0 and view.json_requested and view.tools_requested
    plain = parse_request(_chat(("user", "x"), response_format={"type": "text"}, tools=[]))
    assert plain is not None and not plain.json_requested and not plain.tools_requested


def test_mirrored_routes() -> None:
    """Only POSTs to the three inference routes are mirrored; query strings are ignored."""
    assert mirrored_route("POST", "/v1/chat/completions?x=1") == "/v1/chat/completions"
    assert mirrored_route("POST", "/v1/completions") == "/v1/completions"
    assert mirrored_route("POST", "/v1/embeddings") == "/v1/embeddings"
    assert mirrored_route("GET", "/v1/chat/completions") is None
    assert mirrored_route("POST", "/v1/models") is None
    assert mirrored_route("POST", "/v1/chat/completions/") is None


def test_stored_session_key_is_a_hash() -> None:
    """The stored session key is a 32-hex-digit hash that does not contain the raw value."""
    stored = hash_key(b"alice@example.com")
    assert len(stored) == 32 and "alice" not in stored
    int(stored, 16)


def test_one_decision_for_both_sides() -> None:
    """`decide` is the worker's and the mirror process's sampling decision: per offer it is
    `is_sampled` on the request id (request mode) or the session key (session mode); without a
    session key the session-mode offers stay undecided; only active candidates with a positive
    rate are offered."""
    refs = (10_000.0, 10_000.0)
    endpoints = [
        Endpoint(name="r", url="http://x:1", sample_rate=0.5),
        Endpoint(name="s", url="http://x:2", sample_rate=0.5, sampling="session"),
        Endpoint(name="paused", url="http://x:3", sample_rate=1.0, state="paused"),
        Endpoint(name="zero", url="http://x:4", sample_rate=0.0),
        Endpoint(name="live", url="http://x:5", sample_rate=1.0, role="live"),
    ]
    offers = offers_for(endpoints, refs)
    assert [o.name for o in offers] == ["r", "s"]
    assert [o.session_mode for o in offers] == [False, True]
    seen = {True: 0, False: 0}
    for i in range(400):
        rid, skey = f"req-{i}".encode(), f"sess-{i % 37}".encode()
        chosen, undecided = decide(offers, rid, skey)
        want = [o.name for o in offers if is_sampled(SALT, skey if o.session_mode else rid,
                                                     o.threshold)]  # fmt: skip
        assert [o.name for o in chosen] == want and not undecided
        partial, undecided = decide(offers, rid, None)
        assert undecided and [o.name for o in partial] == [n for n in want if n == "r"]
        seen[bool(partial)] += 1
    assert seen[True] > 100 and seen[False] > 100  # both outcomes occur at rate 0.5
