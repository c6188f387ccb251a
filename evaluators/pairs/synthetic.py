"""Synthetic pairs with planted effects, for tests, examples and the report benchmark.

A `Scenario` describes production and how the candidate (and control) differ from it; `pairs`
draws seeded `Pair` Structs from it. Latencies are lognormal around a per-request base (requests
differ a lot) with independent per-arm noise; at temperature 0 an arm "diverges" from production
with a given probability (its text then differs after a random prefix).
"""

from __future__ import annotations

import hashlib
import json

import msgspec
import numpy as np

from domain.outcomes import ErrorKind
from evaluators.pairs.types import ArmObs, Pair

_WORDS = (
    "the model returns a short answer about caching tokens and latency in batches "
    "while the scheduler keeps the queue warm for every request of the session"
).split()


class Arm(msgspec.Struct, frozen=True, kw_only=True):
    """How one arm behaves relative to the shared per-request base."""

    ttft_ratio: float = 1.0  # multiplies TTFT on every turn
    later_turn_ttft_ratio: float = 1.0  # multiplies TTFT on turns >= 2 (KV reuse)
    tpot_ratio: float = 1.0
    length_ratio: float = 1.0
    noise: float = 0.1  # lognormal sigma of the per-arm latency noise
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    divergence: float = 0.0  # P(output differs from production's), temperature 0
    invalid_json: float = 0.0  # P(output is not JSON when JSON was asked)


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    """Production plus a candidate and an optional control, and the request mix."""

    candidate: Arm = Arm()
    control: Arm | None = Arm()
    production: Arm = Arm()
    temperature: float | None = 0.0
    later_turn_fraction: float = 0.5
    session_turns: int = 4  # turns per conversation (session_key shared)
    json_fraction: float = 0.0
    tools_fraction: float = 0.0
    base_ttft_s: float = 0.2
    base_tpot_s: float = 0.02
    base_tokens: float = 120.0
    missing_candidate: float = 0.0  # P(the candidate's copy was lost)


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(_WORDS, size=max(1, words)).tolist())


def _diverged(rng: np.random.Generator, text: str) -> str:
    cut = int(rng.integers(0, max(1, len(text))))
    return text[:cut] + " " + _text(rng, 8)


class _Request(msgspec.Struct, frozen=True):
    t: float
    turn: int
    base_ttft: float
    base_tpot: float
    tokens: int
    wants_json: bool
    text: str
    tools: str | None


def _arm(rng: np.random.Generator, spec: Arm, req: _Request, *, is_prod: bool) -> ArmObs:
    if spec.error_rate and rng.random() < spec.error_rate:
        return ArmObs(status=500, error_kind=ErrorKind.HTTP_5XX, started_at=req.t)
    if spec.timeout_rate and rng.random() < spec.timeout_rate:
        return ArmObs(status=0, error_kind=ErrorKind.TIMEOUT, started_at=req.t)
    ratio = spec.ttft_ratio * (spec.later_turn_ttft_ratio if req.turn >= 1 else 1.0)
    ttft = req.base_ttft * ratio * float(rng.lognormal(0.0, spec.noise))
    tpot = req.base_tpot * spec.tpot_ratio * float(rng.lognormal(0.0, spec.noise))
    k = max(2, round(req.tokens * spec.length_ratio * float(rng.lognormal(0.0, 0.05))))
    out_text = req.text
    if not is_prod and spec.divergence and rng.random() < spec.divergence:
        out_text = _diverged(rng, req.text)
    if req.wants_json and spec.invalid_json and rng.random() < spec.invalid_json:
        out_text = req.text[:-1]
    return ArmObs(
        status=200,
        started_at=req.t,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=ttft + tpot * (k - 1),
        inter_event_p50_s=tpot * 0.95,
        inter_event_p99_s=tpot * 2.0,
        output_tokens=k,
        token_counter="tokenize:synthetic",
        usage_tokens=k + 1,
        token_events=k,
        prompt_tokens=200 + 150 * req.turn,
        cached_tokens=(150 * req.turn if is_prod else 0),
        finish_reason="stop",
        output_hash=hashlib.blake2b(out_text.encode(), digest_size=16).hexdigest(),
        output_text=out_text,
        tool_calls=req.tools,
    )


def pairs(scenario: Scenario, n: int, *, seed: int = 0, start: float = 1.7e9) -> list[Pair]:
    """n seeded pairs of the scenario, one every 0.5 s from `start`."""
    rng = np.random.default_rng(seed)
    sc = scenario
    out: list[Pair] = []
    for i in range(n):
        session = i // sc.session_turns
        turn = int(rng.random() < sc.later_turn_fraction) * int(rng.integers(1, sc.session_turns))
        tokens = max(2, int(sc.base_tokens * float(rng.lognormal(0.0, 0.4))))
        wants_json = bool(rng.random() < sc.json_fraction)
        wants_tools = bool(rng.random() < sc.tools_fraction)
        req = _Request(
            t=start + 0.5 * i,
            turn=turn,
            base_ttft=sc.base_ttft_s * float(rng.lognormal(0.0, 0.5)),
            base_tpot=sc.base_tpot_s * float(rng.lognormal(0.0, 0.3)),
            tokens=tokens,
            wants_json=wants_json,
            text=(
                json.dumps({"answer": _text(rng, 6)})
                if wants_json
                else _text(rng, max(2, tokens // 3))
            ),
            tools=json.dumps([{"name": "lookup", "arguments": '{"q": "x"}'}])
            if wants_tools
            else None,
        )
        prod = _arm(rng, sc.production, req, is_prod=True)
        lost = rng.random() < sc.missing_candidate
        cand = None if lost else _arm(rng, sc.candidate, req, is_prod=False)
        ctrl = _arm(rng, sc.control, req, is_prod=False) if sc.control is not None else None
        out.append(
            Pair(
                exchange_id=f"ex-{i:08d}",
                received_at=req.t,
                production=prod,
                candidate=cand,
                control=ctrl,
                session_key=f"{session + 1:032x}",
                turn_index=turn,
                temperature=sc.temperature,
                stream=True,
                json_requested=wants_json,
                tools_requested=wants_tools,
                model="m",
            )
        )
    return out
