"""Sizing a model upgrade judged by an LLM grader (`evaluators.metrics.preference`): the graded
sessions a preference decision needs at a margin, the grader calls and what they cost. The
preference test is the bounded test of `evaluators.judge.plan`, mirrored, so its sizing is too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evaluators.judge.plan import bounded_units

# sd of one graded session's mean pair score when the grader is decisive most of the time:
# scores are ±1 per verdict, so near 0.9 at 80 % decisive (STATISTICS.md: σ² ≈ decisive share).
PREFERENCE_SD = 0.9
# What a grading costs when nothing is measured yet: a short conversation, two answers and the
# rubric in, a JSON object out.
TOKENS_PER_GRADING = 1_500


@dataclass(frozen=True, slots=True)
class PreferencePlan:
    """Graded sessions a preference decision needs at a margin, and what they cost."""

    margin: float  # the net preference the candidate may lose at most
    sessions: int | None  # graded sessions by which QUANTILE of runs show it (None: > MAX)
    gradings: int | None  # grader calls: sessions × pairs each × (1 + swap_rate)
    tokens: int | None
    cost_usd: float | None


def preference_plan(
    margins: tuple[float, ...],
    *,
    alpha: float,
    sd: float = PREFERENCE_SD,
    pairs_per_session: float = 1.0,
    swap_rate: float = 0.25,
    tokens_per_grading: float = TOKENS_PER_GRADING,
    price_per_mtok: float = 0.0,
) -> list[PreferencePlan]:
    """For each margin: the graded sessions by which QUANTILE of runs of a candidate truly at
    net 0 show its net preference above -margin, with the verdict's own betting sequence on
    unit values of sd `sd` (the preference test is this bounded test, mirrored), and what the
    grader is paid for them."""
    out = []
    for m in margins:
        units = bounded_units(m, alpha, sd)
        if units is None:
            out.append(PreferencePlan(m, None, None, None, None))
            continue
        calls = math.ceil(units * pairs_per_session * (1.0 + swap_rate))
        tokens = math.ceil(calls * tokens_per_grading)
        out.append(PreferencePlan(m, units, calls, tokens, tokens / 1e6 * price_per_mtok))
    return out
