"""Teacher-forced scoring of production's answer, pure: the requests and what their answers say.

A scoring copy asks an engine how likely production's answer was, token by token, on the same
conversation: no generation, one prefill of prompt + answer with prompt logprobs (vLLM's
`prompt_logprobs`, which skips the prefix cache). Three requests to the scored engine, built
here, sent by `gateway.mirror.scoring.jobs`:

1. `POST /tokenize` of the conversation as the prompt production answered (chat: the messages
   with the generation prompt; completions: the prompt) -> the prefix length P;
2. `POST /tokenize` of the conversation followed by production's answer (chat: an assistant
   message continued, `continue_final_message`, no generation prompt) -> the token ids;
3. `POST /v1/completions` with those ids as the prompt, `prompt_logprobs: k`, `max_tokens: 1`
   -> per position the logprob and rank of the token at that position and the top k.

Scoring by token ids keeps both arms on the very same sequence (their tokenizers must agree,
checked by the ids). Positions P.. are production's answer. Kept per arm: the mean
log-likelihood of those tokens, the share whose top-1 is production's token, and, for a
candidate scored beside a control, a top-k estimate of KL(control || candidate) per token.
Pure: no IO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgspec

from domain.errors import CanaryError

__all__ = [
    "LOGPROB_FLOOR",
    "Scored",
    "ScoringError",
    "ScoringUnsupported",
    "full_request",
    "parse_ids",
    "parse_scores",
    "prefix_request",
    "score_request",
    "topk_kl",
]

# A logprob of -inf (a token the engine's precision rounds to zero) counts as this, so one
# position cannot make a mean infinite.
LOGPROB_FLOOR: Final = -50.0
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


class ScoringError(CanaryError):
    """A scoring answer that cannot be read (the pair is counted `score_failed`)."""


class ScoringUnsupported(ScoringError):
    """The engine refused the scoring parameters (400/404/405/422/501): the arm is counted
    `score_unsupported` and the metric is ungated, never an error of the pair."""


class Scored(NamedTuple):
    """One arm's scores of production's answer."""

    tokens: int
    logprob: float  # mean log-likelihood of production's tokens (nats/token)
    top1: float  # share of positions whose most likely token is production's
    # Per answer position: the top-k (token id -> logprob), for the KL against the control.
    topk: tuple[dict[str, float], ...]


def _messages(request: Mapping[str, Any]) -> list[Any] | None:
    messages = request.get("messages")
    return messages if isinstance(messages, list) and messages else None


def prefix_request(route: str, request: Mapping[str, Any], model: str | None) -> bytes | None:
    """The /tokenize body of the prompt production answered; None: nothing to score."""
    name = model or request.get("model")
    if route == "/v1/chat/completions":
        messages = _messages(request)
        if messages is None:
            return None
        body: dict[str, Any] = {"model": name, "messages": messages, "add_generation_prompt": True}
        if request.get("tools"):
            body["tools"] = request["tools"]
        return _encode(body)
    prompt = request.get("prompt")
    if route == "/v1/completions" and isinstance(prompt, str):
        return _encode({"model": name, "prompt": prompt})
    return None


def full_request(
    route: str, request: Mapping[str, Any], answer: str, model: str | None
) -> bytes | None:
    """The /tokenize body of the prompt followed by production's answer."""
    name = model or request.get("model")
    if route == "/v1/chat/completions":
        messages = _messages(request)
        if messages is None:
            return None
        body: dict[str, Any] = {
            "model": name,
            "messages": [*messages, {"role": "assistant", "content": answer}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
        if request.get("tools"):
            body["tools"] = request["tools"]
        return _encode(body)
    prompt = request.get("prompt")
    if route == "/v1/completions" and isinstance(prompt, str):
        return _encode({"model": name, "prompt": prompt + answer})
    return None


def score_request(ids: Sequence[int], model: str | None, k: int) -> bytes:
    """The /v1/completions body that scores `ids` (not streamed: vLLM refuses prompt logprobs
    on a stream)."""
    return _encode(
        {
            "model": model,
            "prompt": list(ids),
            "prompt_logprobs": k,
            "max_tokens": 1,
            "temperature": 0,
            "stream": False,
        }
    )


def parse_ids(body: bytes) -> list[int]:
    """The token ids of a /tokenize answer."""
    try:
        tokens = _decode(body).get("tokens")
    except msgspec.DecodeError as exc:
        raise ScoringError("tokenize answer is not JSON") from exc
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ScoringError("tokenize answer has no token ids")
    return tokens


def _prompt_logprobs(obj: Mapping[str, Any]) -> list[Any] | None:
    found = obj.get("prompt_logprobs")  # chat completions put them at the top
    if found is None:
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            found = choices[0].get("prompt_logprobs")
    return found if isinstance(found, list) else None


def _logprob(entry: Any) -> float:
    value = entry.get("logprob") if isinstance(entry, dict) else entry
    if not isinstance(value, int | float):
        raise ScoringError("a prompt logprob is not a number")
    return max(float(value), LOGPROB_FLOOR) if not math.isnan(value) else LOGPROB_FLOOR


def parse_scores(body: bytes, ids: Sequence[int], prefix: int) -> Scored:
    """The scores of positions `prefix`.. of `ids` from a prompt-logprobs answer."""
    try:
        obj = _decode(body)
    except msgspec.DecodeError as exc:
        raise ScoringError("scoring answer is not JSON") from exc
    positions = _prompt_logprobs(obj)
    if positions is None or len(positions) != len(ids):
        raise ScoringError("scoring answer has no prompt logprobs for every token")
    total, top1, topk = 0.0, 0, []
    for i in range(prefix, len(ids)):
        at = positions[i]
        if not isinstance(at, dict):
            raise ScoringError(f"no logprobs at position {i}")
        mine = at.get(str(ids[i]))
        if mine is None:
            raise ScoringError(f"production's token is missing at position {i}")
        total += _logprob(mine)
        rank = mine.get("rank") if isinstance(mine, dict) else None
        if rank == 1:
            top1 += 1
        topk.append({t: _logprob(e) for t, e in at.items()})
    n = len(ids) - prefix
    if n <= 0:
        raise ScoringError("production's answer has no tokens")
    return Scored(n, total / n, top1 / n, tuple(topk))


def topk_kl(
    reference: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]]
) -> float:
    """Mean over positions of a top-k estimate of KL(reference || other), in nats per token.

    At each position the vocabulary is coarsened to the reference's returned tokens plus "the
    rest" (KL over a coarsening is a lower bound of the full KL, as llama.cpp's top-k
    KL-divergence is); a token the other engine did not return gets its smallest returned
    probability (it is at most that likely).
    """
    if not reference or len(reference) != len(other):
        return math.nan
    total = 0.0
    for ref, oth in zip(reference, other, strict=True):
        floor = min(oth.values()) if oth else LOGPROB_FLOOR
        kl, p_sum, q_sum = 0.0, 0.0, 0.0
        for token, lp in ref.items():
            p = math.exp(lp)
            lq = oth.get(token, floor)
            kl += p * (lp - lq)
            p_sum += p
            q_sum += math.exp(lq)
        p_rest, q_rest = max(1.0 - p_sum, 0.0), max(1.0 - q_sum, 1e-12)
        if p_rest > 1e-12:
            kl += p_rest * math.log(p_rest / q_rest)
        total += max(kl, 0.0)
    return total / len(reference)
