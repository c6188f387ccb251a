"""Tests of the simulator's pure core: profiles, tokenizer, template, caches, latency, answers."""

from __future__ import annotations

import json
import math
import statistics

import jsonschema
import msgspec
import pytest

from domain.errors import UsageError
from gateway.sim import engine as eng
from gateway.sim.calls import (
    AUTO_CALL_SHARE,
    BREAKS,
    ToolSpec,
    broken_arguments,
    call_arguments,
    choose_calls,
)
from gateway.sim.engine import (
    BLOCK_SIZE,
    Engine,
    PrefixCache,
    SessionStore,
    TokenCache,
    answer_pieces,
    chat_segments,
    render_chat,
    split_pieces,
    tokenize,
)
from gateway.sim.profiles import FAULTS, PROFILES, SimProfile, get_profile

REQUIRED_PROFILES = {
    "baseline",
    "control",
    "bi-kv",
    "quantized",
    "fast",
    "hang",
    "reset-mid-stream",
    "error-500",
    "slow-drip",
    "garbage",
    "slow-read",
}
WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 16},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "hourly": {"type": "boolean"},
        },
        "required": ["city", "unit"],
    },
)


def _prompt(i: int) -> str:
    return render_chat([("user", f"Question number {i}: what does the cache hold?")])


# --- profiles -------------------------------------------------------------------------------


def test_every_required_profile_exists_and_is_named_after_its_key() -> None:
    """PROFILES holds every profile the other modules rely on, each carrying its own name."""
    assert set(PROFILES) >= REQUIRED_PROFILES
    assert all(p.name == key for key, p in PROFILES.items())
    assert {PROFILES[f].fault for f in FAULTS} == set(FAULTS)


def test_control_has_the_baseline_configuration_under_another_name() -> None:
    """The A/A control differs from the baseline only by its name."""
    base = msgspec.structs.asdict(PROFILES["baseline"])
    control = msgspec.structs.asdict(PROFILES["control"])
    assert base.pop("name") == "baseline" and control.pop("name") == "control"
    assert base == control


def test_get_profile_applies_overrides_and_rejects_bad_input() -> None:
    """get_profile overrides knobs, and names the valid profiles or fields when asked wrongly."""
    quick = get_profile("bi-kv", time_scale=0.01, served_model_names=["a", "b"])
    assert quick.time_scale == 0.01 and quick.session_kv and quick.name == "bi-kv"
    assert quick.served_model_names == ("a", "b")
    with pytest.raises(UsageError, match="valid profiles: baseline, control"):
        get_profile("nope")
    with pytest.raises(UsageError, match="valid fields"):
        get_profile("baseline", warp_speed=9)
    with pytest.raises(UsageError, match="divergence"):
        get_profile("quantized", divergence=1.5)
    with pytest.raises(UsageError, match="unknown fault"):
        SimProfile(name="x", fault="meltdown")
    with pytest.raises(UsageError, match="time_scale"):
        get_profile("baseline", time_scale=-1.0)


# --- tokenizer and template -----------------------------------------------------------------


def test_tokenizer_round_trips_and_is_deterministic() -> None:
    """Pieces join back to the text, and the same text always gives the same ids."""
    text = '<|im_start|>user\nHello,  world! {"a": 1}\tdone<|im_end|>\n'
    assert "".join(split_pieces(text)) == text
    assert tokenize(text) == tokenize(text)
    assert split_pieces("Hello, world")[:3] == ["Hello", ",", " world"]
    assert all(0 <= t < eng.VOCAB_SIZE for t in tokenize(text))


def test_generated_text_retokenizes_to_the_same_pieces() -> None:
    """An answer sent back in the next turn tokenizes as generated (session KV relies on it)."""
    profile = PROFILES["baseline"]
    for i in range(50):
        pieces = answer_pieces(profile, eng.text_hash(_prompt(i)), None)
        assert split_pieces("".join(pieces)) == pieces


def test_a_growing_conversation_has_a_growing_shared_prefix() -> None:
    """Each turn's rendered prompt starts with the previous turn's prompt plus its answer."""
    messages: list[tuple[str, str]] = []
    previous: list[int] = []
    for turn in range(4):
        messages.append(("user", f"turn {turn} question"))
        ids = tokenize(render_chat(messages))
        assert ids[: len(previous)] == previous
        messages.append(("assistant", f"answer {turn}."))
        previous = ids


# --- answers --------------------------------------------------------------------------------


def test_greedy_answers_depend_on_the_prompt_only() -> None:
    """At temperature 0 every non-diverging profile gives the same text for the same prompt."""
    prompts = [_prompt(i) for i in range(30)]
    for name in ("baseline", "control", "bi-kv", "fast", "slow-drip"):
        engine = Engine(PROFILES[name], seed=7)
        texts = ["".join(engine.plan(p).pieces) for p in prompts]
        assert texts == ["".join(Engine(PROFILES["baseline"]).plan(p).pieces) for p in prompts]
    lengths = [len(Engine(PROFILES["baseline"]).plan(p).pieces) for p in prompts]
    assert min(lengths) >= 16 and max(lengths) <= 64 and len(set(lengths)) > 5


def test_quantized_diverges_at_about_the_configured_rate() -> None:
    """Over many prompts the share of diverging answers is close to `divergence`, and each
    diverging answer keeps the baseline's first tokens before drifting."""
    base, quant = PROFILES["baseline"], PROFILES["quantized"]
    n, diverged = 2000, 0
    for i in range(n):
        phash = eng.text_hash(_prompt(i))
        a, b = answer_pieces(base, phash, None), answer_pieces(quant, phash, None)
        if a != b:
            diverged += 1
            assert a[0] == b[0]
        assert answer_pieces(quant, phash, None) == b  # reruns agree
    assert abs(diverged / n - quant.divergence) < 0.04
    assert all(
        answer_pieces(get_profile("quantized", divergence=0.0), eng.text_hash(_prompt(i)), None)
        == answer_pieces(base, eng.text_hash(_prompt(i)), None)
        for i in range(100)
    )


def test_sampling_varies_unless_seeded() -> None:
    """Temperature > 0 gives varied answers; a request seed makes them reproducible."""
    engine = Engine(PROFILES["baseline"], seed=1)
    prompt = _prompt(1)
    texts = {"".join(engine.plan(prompt, temperature=0.8).pieces) for _ in range(10)}
    assert len(texts) > 5
    seeded = {"".join(engine.plan(prompt, temperature=0.8, seed=42).pieces) for _ in range(5)}
    assert len(seeded) == 1


def test_max_tokens_cuts_the_answer_with_finish_reason_length() -> None:
    """max_tokens truncates to a prefix of the full answer and reports "length"; otherwise the
    answer ends with an end-of-sequence step and "stop"."""
    engine = Engine(PROFILES["baseline"])
    full = engine.plan(_prompt(3))
    assert full.finish_reason == "stop" and full.eos and full.steps == len(full.pieces) + 1
    cut = engine.plan(_prompt(3), max_tokens=5)
    assert cut.finish_reason == "length" and not cut.eos and cut.steps == 5
    assert cut.pieces == full.pieces[:5]


def test_json_mode_answers_are_json_objects() -> None:
    """response_format json_object yields a valid, deterministic JSON object."""
    engine = Engine(PROFILES["baseline"])
    for i in range(20):
        text = "".join(engine.plan(_prompt(i), json_mode=True).pieces)
        obj = json.loads(text)
        assert isinstance(obj, dict) and isinstance(obj["answer"], str)
        assert text == "".join(engine.plan(_prompt(i), json_mode=True).pieces)


def test_tool_choice_semantics_and_arguments_follow_the_schema() -> None:
    """ "required" always calls, "none" never, "auto" on AUTO_CALL_SHARE of prompts; arguments
    are a JSON object with a schema-typed value for every required property."""
    hashes = [eng.text_hash(_prompt(i)) for i in range(400)]
    assert all(choose_calls(h, [WEATHER], "required", None) == [WEATHER] for h in hashes)
    assert all(choose_calls(h, [WEATHER], "none", None) == [] for h in hashes)
    auto = sum(bool(choose_calls(h, [WEATHER], None, None)) for h in hashes) / len(hashes)
    assert abs(auto - AUTO_CALL_SHARE) < 0.1
    engine = Engine(PROFILES["baseline"])
    for i in range(20):
        plan = engine.plan(_prompt(i), tools=[WEATHER], tool_choice="required")
        assert [c.name for c in plan.calls] == ["get_weather"]
        assert plan.finish_reason == "tool_calls"
        args = json.loads(plan.arguments()[0])
        assert {"city", "unit"} <= set(args) <= {"city", "days", "unit", "hourly"}
        assert isinstance(args["city"], str) and args["unit"] in ("c", "f")
        assert 1 <= args.get("days", 1) <= 16 and isinstance(args.get("hourly", True), bool)


def test_broken_arguments_break_each_way_and_only_then() -> None:
    """Every way of `BREAKS` occurs over many prompts, each makes arguments that a JSON Schema
    validator (or the JSON parser) rejects, and arguments drawn unbroken always validate."""
    schema = dict(WEATHER.parameters or {})
    seen: set[str] = set()
    for i in range(200):
        h = eng.text_hash(_prompt(i))
        args = call_arguments(WEATHER, ["north", "harbour"], h)
        jsonschema.validate(args, schema)
        text = broken_arguments(WEATHER, args, h)
        try:
            broken = json.loads(text)
        except json.JSONDecodeError:
            seen.add("invalid_json")
            continue
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(broken))
        assert errors, text
        seen.add(
            {"required": "missing_required", "type": "wrong_type", "enum": "enum_outside"}[
                str(errors[0].validator)
            ]
        )
    assert seen == set(BREAKS)


def test_chat_segments_tokenize_as_their_join() -> None:
    """Tokens never cross two rendered messages, so the token cache's ids equal the whole
    prompt's, and a message seen before is not tokenized again."""
    messages = [("system", "Be brief."), ("user", "Read  the file, please.\n"), ("tool", "x = 1\n")]
    cache = TokenCache(8)
    for k in range(1, 4):
        segments = chat_segments(messages[:k], '[{"name": "f"}]')
        assert cache.tokenize(segments) == tokenize("".join(segments))
    # Tokenized once each: the tools, three messages and the generation prompt.
    assert cache.misses == 5 and cache.hits == 7


def test_embeddings_are_deterministic_unit_vectors() -> None:
    """The same text always embeds to the same unit-length vector."""
    a, b = eng.embed("hello"), eng.embed("hello")
    assert a == b and a != eng.embed("world")
    assert abs(sum(x * x for x in a) - 1.0) < 1e-9


# --- caches ---------------------------------------------------------------------------------


def test_prefix_cache_matches_whole_leading_blocks_only() -> None:
    """Only full 16-token blocks matched from the start count, chained so a changed early token
    invalidates every later block."""
    cache = PrefixCache(capacity=100)
    tokens = list(range(40))  # 2 full blocks + 8 tokens
    cache.insert(PrefixCache.block_hashes(tokens))
    assert len(cache) == 2
    assert cache.match(PrefixCache.block_hashes(list(range(50)))) == 2
    changed = [999, *range(1, 40)]
    assert cache.match(PrefixCache.block_hashes(changed)) == 0
    assert cache.match(PrefixCache.block_hashes(list(range(20)))) == 1


def test_prefix_cache_is_a_bounded_lru() -> None:
    """The cache never holds more than its capacity and evicts the least recently used block."""
    cache = PrefixCache(capacity=3)
    first = PrefixCache.block_hashes(list(range(BLOCK_SIZE * 2)))
    cache.insert(first)
    cache.insert(PrefixCache.block_hashes([7] * BLOCK_SIZE * 2))
    assert len(cache) == 3
    assert cache.match(first) == 0  # its first block was the oldest


def test_session_store_is_a_bounded_lru() -> None:
    """Session KV keeps at most max_sessions sessions and reports the common prefix held."""
    store = SessionStore(max_sessions=2)
    store.store("a", [1, 2, 3])
    store.store("b", [4, 5])
    assert store.match("a", [1, 2, 9]) == 2
    store.store("c", [6])
    assert len(store) == 2 and store.match("b", [4, 5]) == 0 and store.match("a", [1, 2, 3]) == 3


def test_session_kv_makes_later_turns_prefill_only_new_tokens() -> None:
    """With session_kv a later turn reports everything held (prompt and answer) as cached;
    the baseline reports nothing."""
    results = {}
    for name in ("baseline", "bi-kv"):
        engine = Engine(PROFILES[name])
        messages = [("user", "Tell me about caches, in detail please.")]
        first = engine.plan(render_chat(messages), session="s1")
        engine.finish(first, first.steps)
        messages += [("assistant", "".join(first.pieces)), ("user", "And then?")]
        second = engine.plan(render_chat(messages), session="s1")
        results[name] = (first.prompt_tokens, len(first.pieces), second.cached_tokens)
    prompt, answer, cached = results["bi-kv"]
    assert cached == prompt + answer
    assert results["baseline"][2] == 0


def test_session_kv_never_holds_a_prompt_longer_than_the_model_accepts() -> None:
    """A prompt over max_model_len (which the server rejects) is not kept as session KV."""
    engine = Engine(get_profile("bi-kv", max_model_len=64))
    engine.plan(render_chat([("user", "word " * 100)]), session="big")
    assert len(engine.sessions) == 0


def test_prefix_cache_profile_reports_block_aligned_hits_and_recomputes_the_last_token() -> None:
    """A repeated prompt hits whole blocks, never the full prompt (the last token is computed)."""
    engine = Engine(get_profile("baseline", prefix_cache_blocks=64))
    prompt = render_chat([("user", "word " * 40)])
    assert engine.plan(prompt).cached_tokens == 0
    again = engine.plan(prompt)
    assert again.cached_tokens % BLOCK_SIZE == 0 and 0 < again.cached_tokens < again.prompt_tokens
    engine.reset()
    assert engine.plan(prompt).cached_tokens == 0


# --- latency model --------------------------------------------------------------------------


def test_latency_model_scales_with_uncached_tokens_batch_and_time_scale() -> None:
    """Without jitter, delays follow the formulas exactly and time_scale multiplies them."""
    p = get_profile("baseline", jitter=0.0, time_scale=0.5)
    engine = Engine(p)
    assert engine.prefill_delay(100) == pytest.approx((p.overhead_s + 100 * 0.00005) * 0.5)
    assert engine.decode_delay(0) == pytest.approx(0.008 * 0.5)
    assert engine.decode_delay(10) == pytest.approx((0.008 + 10 * 0.0005) * 0.5)
    fast = Engine(PROFILES["fast"])
    assert fast.prefill_delay(10_000) == 0.0 and fast.decode_delay(100) == 0.0
    quant = Engine(get_profile("quantized", jitter=0.0))
    assert quant.decode_delay(0) == pytest.approx(
        0.6 * Engine(get_profile("baseline", jitter=0.0)).decode_delay(0)
    )


def test_jitter_is_seeded_lognormal_noise() -> None:
    """Jitter varies delays around the model with the configured spread, reproducibly by seed."""
    a = [Engine(PROFILES["baseline"], seed=3).decode_delay(0) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same first draw
    engine = Engine(PROFILES["baseline"], seed=3)
    draws = [engine.decode_delay(0) / 0.008 for _ in range(4000)]
    logs = [math.log(d) for d in draws]
    assert abs(statistics.fmean(logs)) < 0.01
    assert abs(statistics.stdev(logs) - 0.08) < 0.01


def test_prefill_scale_is_checked_before_a_simulator_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`canary sim --prefill-scale 0` is refused with a message naming the flag and exit 2,
    before anything listens."""
    from gateway.cli.main import main

    assert main(["sim", "--profile", "bi-kv", "--prefill-scale", "0"]) == 2
    assert "--prefill-scale must be in (0, 100]" in capsys.readouterr().err
