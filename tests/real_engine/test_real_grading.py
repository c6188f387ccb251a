"""A real vLLM as the LLM grader: the plumbing of a model upgrade end to end, not judgement.

The engines are the test session's (`real_engines`): `live` (float32) answers as production,
`quantized` (bfloat16) is the candidate, and `control`, a separate vLLM process of the same tiny
model, serves as the grader. The mirror runs in-process (as tests/mirror/test_mirror_grading.py
does) and sends each pair to the grader in both orders with a `json_schema` response_format;
vLLM's structured outputs make the tiny model answer a valid verdict object, so no grading is
unparseable. The tiny model grading its own answers prefers whatever it prefers (a grader of
the arms' own model prefers itself): the test reads the plumbing and the grader's measured
position bias, never which arm won.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import numpy as np

from domain.endpoint import CandidateSpec, Endpoint, GraderSpec
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import preference
from evaluators.pairs.gradings import Gradings
from evaluators.pairs.types import PairSet
from gateway.mirror.replay.sinks import InMemorySink
from gateway.server.meter import MeterResult
from tests.mirror.test_mirror_lane import headers, make_mirror
from tests.real_engine import engines as eng

PROMPTS = 6  # graded in both orders: 12 gradings, a few seconds of the grader's CPU
QUESTIONS = (
    "Name one use of a hash table.",
    "What does a cache do?",
    "Why close a file after reading it?",
    "What is a stream?",
    "What does a parser return?",
    "Why set a default encoding?",
)


def _body(question: str) -> bytes:
    return json.dumps(
        {
            "model": eng.MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 24,
            "temperature": 0,
        }
    ).encode()


async def _production(http: aiohttp.ClientSession, url: str, body: bytes) -> str:
    async with http.post(
        url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
    return str(doc["choices"][0]["message"]["content"])


async def _run(engines: dict[str, eng.Engine]) -> InMemorySink:
    grader = GraderSpec(url=engines["control"].url, model=eng.MODEL, swap_rate=1.0)
    cand = Endpoint(
        name="bf16", url=engines["quantized"].url, sample_rate=1.0, timeout_s=120, grader=grader
    )
    sink = InMemorySink()
    mirror = make_mirror([cand], sink, **{"mirror.grading_timeout_s": 120.0})
    await mirror.start()
    try:
        async with aiohttp.ClientSession() as http:
            for i, question in enumerate(QUESTIONS[:PROMPTS]):
                body = _body(question)
                text = await _production(http, engines["live"].url, body)
                token = mirror.on_request(
                    "POST", "/v1/chat/completions", headers(), body, f"req-{i}"
                )
                assert token is not None
                mirror.on_response(token, MeterResult(status=200, is_sse=False, text=text), None)
        async with asyncio.timeout(600):
            while len(sink.gradings) < 2 * PROMPTS:
                await asyncio.sleep(0.5)
                await mirror.wait_idle()
    finally:
        await mirror.close()
    return sink


def _gradings(sink: InMemorySink) -> Gradings:
    ids = {e.id: (e.received_at, e.session_key) for e in sink.exchanges}
    rows = [
        (
            g.exchange_id,
            ids[g.exchange_id][0],
            ids[g.exchange_id][1],
            g.candidate_first,
            g.swapped,
            g.outcome,
            g.winner,
            g.candidate_chars,
            g.reference_chars,
            g.prompt_tokens,
            g.completion_tokens,
        )
        for g in sorted(sink.gradings, key=lambda g: (ids[g.exchange_id][0], g.swapped))
    ]
    return Gradings.from_rows(rows)


def test_real_grader_grades_bf16_against_fp32(real_engines: dict[str, eng.Engine]) -> None:
    """Every pair of bf16 against fp32 answers is graded by the real grader in both orders, with
    a valid verdict each time (unparseable 0), its tokens counted, and the report's net
    preference, win/tie/loss shares and the grader's position bias computed from them."""
    sink = asyncio.run(_run(real_engines))
    assert len(sink.gradings) == 2 * PROMPTS
    assert [g.outcome for g in sink.gradings] == ["graded"] * (2 * PROMPTS)
    assert all(g.attempts == 1 and g.winner is not None for g in sink.gradings)
    assert all(g.prompt_tokens > 50 and g.completion_tokens > 0 for g in sink.gradings)
    for pair in {g.exchange_id for g in sink.gradings}:
        orders = sorted(g.candidate_first for g in sink.gradings if g.exchange_id == pair)
        assert orders == [False, True]
    g = _gradings(sink)
    cand = CandidateSpec(
        name="bf16",
        url="http://127.0.0.1:9",
        grader=GraderSpec(url="http://127.0.0.1:9", model=eng.MODEL),
    ).to_endpoint()
    ctx = EvalContext(
        pairs=PairSet.empty(0), settings=VerdictSettings(), candidate=cand, gradings=g
    )
    by = {r.name: r for r in preference.preference(ctx)}
    d = by["preference"].detail
    assert d["pairs_graded"] == PROMPTS and d["gradings_unparseable"] == 0
    assert d["grading_failure_share"] == 0.0
    assert np.isclose(float(d["win_share"]) + float(d["tie_share"]) + float(d["loss_share"]), 1)
    bias = by["grader_position_bias"]
    print(  # the numbers the report states (pytest -s): recorded in docs/grading.md
        f"real grader: net {by['preference'].estimate}, win/tie/loss {d['win_share']:.2f}/"
        f"{d['tie_share']:.2f}/{d['loss_share']:.2f}, position bias {bias.estimate} over "
        f"{bias.n} decisive verdicts, flip rate {d['flip_rate']}, tokens {d['grader_tokens']}"
    )
