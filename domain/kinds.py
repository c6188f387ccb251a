"""Candidate kinds: what a kind of candidate is for, as the metric it must improve.

One table: a new kind is one row. A kind not listed has no goal of its own (its verdict rests on
the guardrails plus any goal an operator configures). Pure: no IO.
"""

from __future__ import annotations

from typing import Final

# kind -> the goal metrics (by metric name) that a candidate of that kind must improve.
GOALS: Final[dict[str, tuple[str, ...]]] = {
    # Prefix / bi-directional KV reuse: later turns of a session reuse the cached prefix.
    "bi-kv": ("ttft_later_turns",),
    # A quantized checkpoint or KV cache: cheaper per output token at equal quality.
    "quantized": ("cost",),
    # A replica of production's exact configuration: the noise floor, never promoted for a goal.
    "control": (),
}
# Kinds whose first turn must be gated as well as the later-turn goal (a KV-reuse candidate can
# trade turn 1 for later turns).
GATES_FIRST_TURN: Final = frozenset({"bi-kv"})
CONTROL: Final = "control"
# Default share of a candidate's pairs scored with prompt logprobs (teacher forcing, see
# gateway/mirror/scoring/forced.py) when its `score_rate` is not set: on for quantized candidates,
# whose damage shows in token probabilities before greedy answers flip; off for the others.
# Each scored pair costs the candidate and the control one full prefill of prompt + answer.
SCORE_RATES: Final[dict[str, float]] = {"quantized": 0.1}
# Kinds for which `logprob_divergence` is critical (decisive harm rejects at any look); for
# the others it is a guardrail.
SCORE_CRITICAL: Final = frozenset({"quantized"})


def score_rate(kind: str, declared: float | None) -> float:
    """The share of pairs scored: the candidate's own `score_rate`, else its kind's default."""
    return declared if declared is not None else SCORE_RATES.get(kind, 0.0)


def is_goal(kind: str, metric: str) -> bool:
    """Whether `metric` is a goal of a candidate of `kind`."""
    return metric in GOALS.get(kind, ())
