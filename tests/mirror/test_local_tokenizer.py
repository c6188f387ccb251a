"""The local tokenizer and tool calls' tokens: an answer's output tokens are its text's plus each
tool call's name and arguments, counted by the model's own tokenizer.json through the
`tokenizers` library (one trained here, nothing downloaded) for every arm alike; a bad path is a
config error naming the key; an engine that counts answers for the others has its /tokenize
requests counted per candidate, exported and carried into its stored accounting (real
TokenCounter and Mirror, an engine on 127.0.0.1:0, real databases)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from domain.accounting import TOKENIZE_REQUESTS_KEY
from domain.endpoint import Endpoint
from domain.errors import ConfigError
from domain.exposition import render
from domain.records import ObservationRecord
from evaluators.pairs.load import load_accounting
from gateway.config.load import config_from, load_config
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.replay.tokens import TokenCounter
from storage import queries
from tests.fixtures_net import start_app
from tests.mirror.test_mirror_lane import Run, make_mirror, run
from tests.mirror.test_token_counter import production
from tests.packing_engine import PackingEngine, tokenize

__all__ = ["run"]

CORPUS = [
    "The weather in Paris is mild today, with light rain expected in the evening.",
    "Call the function get_weather with the city and the units you want.",
    '{"city": "Paris", "units": "celsius", "days": [1, 2, 3]}',
    "Tool calls carry a name and arguments; the arguments are JSON text.",
] * 20
TEXT = "Let me look that up: the weather in Paris, in celsius."
CALLS = [
    {"name": "get_weather", "arguments": '{"city": "Paris", "units": "celsius"}'},
    {"name": "get_forecast", "arguments": '{"city": "Paris", "days": [1, 2, 3]}', "id": "c1"},
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json trained on a few sentences (as a model folder ships it)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    path = tmp_path_factory.mktemp("model") / "tokenizer.json"
    tok.save(str(path))
    return path


def _own_count(path: Path, *texts: str) -> int:
    """The tokenizer's own count of each text, without special tokens, summed."""
    tok = Tokenizer.from_file(str(path))
    return sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)


def _answer(arm: str, text: str | None, calls: list[dict[str, str]] | None) -> ObservationRecord:
    return ObservationRecord(
        exchange_id="x", endpoint="live" if arm == "production" else "cand", arm=arm,
        started_at=0.0, status=200, output_text=text,
        tool_calls=None if calls is None else msgspec.json.encode(calls).decode(),
        ttft_s=0.01, e2e_s=0.11, token_events=3 if arm == "production" else 9,
    )  # fmt: skip


async def _counted(counter: TokenCounter, sink: InMemorySink, n: int) -> None:
    async with asyncio.timeout(10):
        while len(sink.observations) < n:
            await counter.wait_idle()
            await asyncio.sleep(0)


def test_a_call_answer_counts_text_names_and_arguments_with_the_local_tokenizer(
    run: Run[None], tokenizer_file: Path
) -> None:
    """Text plus two tool calls count exactly the tokenizer's own count of the text and each
    name and arguments; a call-only answer counts its calls; the label names the file's
    sha256; a text cut at store_text_max_chars stays uncounted."""

    digest = hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()[:16]

    async def scenario() -> None:
        sink = InMemorySink()
        config = config_from({"mirror.token_counter": f"local:{tokenizer_file.parent}"}).mirror
        counter = TokenCounter(sink, config)
        with_text = _answer("production", TEXT, CALLS)
        only_calls = _answer("candidate", None, CALLS[:1])
        cut = _answer("candidate", TEXT[:10], CALLS)
        cut.text_truncated = True
        for record in (with_text, only_calls, cut):
            counter.put_observation(record)
        await _counted(counter, sink, 3)
        await counter.close(1.0)
        pieces = [TEXT] + [p for c in CALLS for p in (c["name"], c["arguments"])]
        assert with_text.output_tokens == _own_count(tokenizer_file, *pieces)
        first = CALLS[0]
        assert only_calls.output_tokens == _own_count(
            tokenizer_file, first["name"], first["arguments"]
        )
        assert with_text.token_counter == only_calls.token_counter == f"local:{digest}"
        assert cut.output_tokens is None and cut.token_counter is None
        assert counter.outcomes["counted"] == 2 and counter.outcomes["text_cut"] == 1
        assert counter.requests == {}  # no engine was asked

    run(scenario())


def test_both_arms_are_counted_alike_by_one_local_tokenizer(
    run: Run[None], tokenizer_file: Path
) -> None:
    """Production and a candidate that answer the same text and calls in different numbers of
    SSE events get the same count from the same tokenizer, and TPOT from that count; through
    the real mirror with a candidate engine, no arm receives a /tokenize request."""

    async def scenario() -> None:
        sink = InMemorySink()
        config = config_from({"mirror.token_counter": f"local:{tokenizer_file}"}).mirror
        counter = TokenCounter(sink, config)
        prod, cand = _answer("production", TEXT, CALLS), _answer("candidate", TEXT, CALLS)
        counter.put_observation(prod)
        counter.put_observation(cand)
        await _counted(counter, sink, 2)
        await counter.close(1.0)
        assert prod.output_tokens == cand.output_tokens is not None
        assert prod.token_counter == cand.token_counter is not None
        n = prod.output_tokens
        assert prod.tpot_s is not None and abs(prod.tpot_s - 0.1 / (n - 1)) < 1e-9
        assert cand.tpot_s == prod.tpot_s  # one count, one span: TPOT alike, events aside

        engine = PackingEngine(3)
        served = await start_app(engine.app())
        sink = InMemorySink()
        eps = [Endpoint(name="cand", url=served.url, sample_rate=1.0, kind="control")]
        mirror = make_mirror(eps, sink, **{"mirror.token_counter": f"local:{tokenizer_file}"})
        await mirror.start()
        try:
            production(mirror, "r1")
            async with asyncio.timeout(10):
                while len(sink.observations) < 2:
                    await mirror.wait_idle()
                    await asyncio.sleep(0.01)
        finally:
            await mirror.close()
            await served.close()
        labels = {o.token_counter for o in sink.observations}
        assert labels == {prod.token_counter}
        assert all(o.output_tokens for o in sink.observations)
        assert engine.tokenize_calls == 0 and mirror.tokens.requests == {}

    run(scenario())


def test_a_local_tokenizer_that_is_not_there_is_a_config_error(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    """A missing file, a folder without tokenizer.json, or a file the library cannot load stop
    the config load with an error naming mirror.token_counter and the path; a good one loads."""
    not_a_tokenizer = tmp_path / "tokenizer.json"
    not_a_tokenizer.write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    for value, says in (
        ("local:/nonexistent/tokenizer.json", "/nonexistent/tokenizer.json"),
        (f"local:{empty}", str(empty / "tokenizer.json")),
        (f"local:{not_a_tokenizer}", "not a tokenizer.json"),
        ("local:", "needs a path"),
    ):
        config = tmp_path / "gateway.toml"
        config.write_text(f'[mirror]\ntoken_counter = "{value}"\n')
        with pytest.raises(ConfigError) as caught:
            load_config(str(config), environ={})
        assert "'mirror.token_counter'" in str(caught.value) and says in str(caught.value)
    config.write_text(f'[mirror]\ntoken_counter = "local:{tokenizer_file.parent}"\n')
    assert load_config(str(config), environ={}).mirror.token_counter.startswith("local:")


async def test_tokenize_requests_are_counted_per_candidate_exported_and_stored(
    db_engine: AsyncEngine,
) -> None:
    """With a control engine counting every arm, each /tokenize request it answers is counted
    for it (text and tool-call pieces alike): the count equals what the engine saw, appears on
    /metrics by candidate, in its copy counters, and in its stored accounting."""
    engine = PackingEngine(4)
    served = await start_app(engine.app())
    sink = InMemorySink()
    eps = [Endpoint(name="ctl", url=served.url, sample_rate=1.0, kind="control")]
    mirror = make_mirror(eps, sink)
    await mirror.start()
    try:
        production(mirror, "r1")
        mirror.tokens.put_observation(_answer("production", "alpha beta", CALLS[:1]))
        async with asyncio.timeout(10):
            while len(sink.observations) < 3:
                await mirror.wait_idle()
                await asyncio.sleep(0.01)
    finally:
        await mirror.close()
        await served.close()
    (counted,) = [o for o in sink.observations if o.tool_calls is not None]
    first = CALLS[0]
    want = sum(len(tokenize(t)) for t in ("alpha beta", first["name"], first["arguments"]))
    assert counted.output_tokens == want and counted.token_counter == "tokenize:ctl"
    asked = engine.tokenize_calls
    assert asked >= 4 and mirror.tokens.requests == {"ctl": asked}
    text = "\n".join(render(mirror.tokens.prometheus_lines()))
    assert f'canary_mirror_tokenize_requests_total{{candidate="ctl"}} {asked}' in text
    counters = mirror.counters()["ctl"]
    assert counters[TOKENIZE_REQUESTS_KEY] == asked
    await queries.upsert_counters(db_engine, "replica-1", {"ctl": counters})
    accounting = await load_accounting(db_engine, "ctl")
    assert accounting[TOKENIZE_REQUESTS_KEY] == asked
