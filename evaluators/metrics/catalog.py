"""The one list of metric evaluators, in report order.

An evaluator is a function `(EvalContext) -> list[MetricResult]`: it reads the PairSet, computes
per-pair values and judges them with `evaluators.judge.metric.judge_mean` / `judge_bounded`. It does
no IO and decides nothing about the verdict. Adding a measured per-pair quantity end to end (the
observation field, the meter, its evaluator, one line here, a migration) is walked through in
docs/add-a-metric.md.
"""

from __future__ import annotations

from collections.abc import Callable

from evaluators.human import metric as human
from evaluators.judge.metric import EvalContext, MetricResult
from evaluators.metrics import (
    cost,
    divergence,
    errors,
    latency,
    preference,
    quality,
    throughput,
    toolcalls,
)

Evaluator = Callable[[EvalContext], list[MetricResult]]

EVALUATORS: tuple[Evaluator, ...] = (
    # goals first: they are why the candidate exists
    latency.ttft_later_turns,
    cost.cost,
    # what a kind must not trade for its goal (turn 1 of a KV-reuse candidate)
    latency.ttft_first_turn,
    # latency
    latency.ttft,
    latency.tpot,
    latency.e2e,
    latency.slo_exceedance,
    latency.inter_event,
    latency.tail_quantiles,
    # failures
    errors.failures,
    errors.timeouts,
    errors.lost,
    # quality
    quality.exact_match,
    quality.first_divergence,
    quality.similarity,
    quality.json_validity,
    quality.tool_calls,
    toolcalls.tool_validity,
    quality.finish_reason,
    quality.output_length,
    divergence.logprob_divergence,
    # a model upgrade's quality: preference from its LLM grader
    preference.preference,
    human.human_preference,
    # throughput
    throughput.decode_speed,
)


def run_all(ctx: EvalContext, evaluators: tuple[Evaluator, ...] = EVALUATORS) -> list[MetricResult]:
    """Every evaluator's results, in registry order. After each, the pages of file-backed
    columns it read are released (`PairSet.release`): a spilled report holds one metric's
    columns at a time. For a candidate with a grader, agreement and output length are then
    marked as information (`preference.informational`)."""
    results: list[MetricResult] = []
    for evaluate in evaluators:
        results += evaluate(ctx)
        ctx.pairs.release()
    preference.informational(results, ctx)
    human.source(results, ctx)
    return results
