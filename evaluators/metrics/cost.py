"""Cost evaluator: dollars per output token, candidate relative to the live endpoint.

Cost per output token = price_per_hour_usd × gpus / output tokens per hour. Capacity cannot be
measured from mirrored traffic (each arm only carries the sampled load), so the ratio assumes
both would be run at the same concurrency and takes throughput ∝ per-request decode speed:
per pair, log(cost ratio) = log(price×gpus ratio) + log(TPOT_candidate / TPOT_reference), with
the decode-speed reference the control when present. The goal of a `quantized` candidate.
"""

from __future__ import annotations

import math

from domain import kinds
from domain.endpoint import Endpoint
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    judge_mean,
    ungate,
)
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.latency import NO_SAME_LOAD, both_ok, log_ratio
from evaluators.metrics.throughput import Row

CAVEAT = (
    "mirrored-load throughput is not capacity: each arm only carried the sampled traffic, so "
    "$/1M tokens at mirrored load overstates cost; the cost ratio assumes equal concurrency "
    "and throughput proportional to per-request decode speed"
)


def hourly(ep: Endpoint | None) -> float | None:
    """price_per_hour_usd × gpus, or None when the price is not set."""
    if ep is None or ep.price_per_hour_usd is None:
        return None
    return ep.price_per_hour_usd * ep.gpus


def cost_spec(s: VerdictSettings, kind: str) -> MetricSpec:
    """Cost ratio: the goal of a `quantized` candidate, a diagnostic otherwise."""
    is_goal = kinds.is_goal(kind, "cost")
    return MetricSpec(
        name="cost",
        label="$ per output token",
        role="goal" if is_goal else "diagnostic",
        harm="higher",
        scale="ratio",
        goal=s.goal_cost_ratio if is_goal else None,
        unit="ratio",
    )


def cost(ctx: EvalContext) -> list[MetricResult]:
    """Cost per output token, candidate / live."""
    spec = cost_spec(ctx.settings, ctx.candidate.kind)
    price_c, price_l = hourly(ctx.candidate), hourly(ctx.live)
    if not price_c or not price_l:
        return [
            empty_result(
                spec,
                ctx.reference,
                "unknown: set price_per_hour_usd on the candidate and the live endpoint",
            )
        ]
    cand, ref, ok = both_ok(ctx)
    x, use = log_ratio(cand.tpot, ref.tpot, ok)
    if len(x) == 0:
        return [empty_result(spec, ctx.reference, "no pair with more than one output token")]
    x = x + math.log(price_c / price_l)
    detail: Detail = {"price_ratio": price_c / price_l}
    res = judge_mean(spec, x, ctx, use=use, reference=ctx.reference, detail=detail)
    return [res if ctx.has_control else ungate(res, NO_SAME_LOAD, blocks=True)]


def cost_table(ctx: EvalContext, loads: dict[str, Row]) -> dict[str, Row]:
    """$/hour and $/1M output tokens at mirrored load, per arm (the live price for production
    and, unless it has its own, for the control), from each arm's load row."""
    ps = ctx.pairs
    prices = {
        "production": hourly(ctx.live),
        "candidate": hourly(ctx.candidate),
        "control": hourly(ctx.control) or hourly(ctx.live),
    }
    arms = ["production", "candidate"] + (["control"] if ps.has_control else [])
    out: dict[str, Row] = {}
    for name in arms:
        load = loads[name]
        price = prices[name]
        tps = load.get("output_tokens_per_s")
        per_m = None
        if price and isinstance(tps, float) and tps > 0:
            per_m = price / 3600.0 / tps * 1e6
        out[name] = {
            "usd_per_hour": price,
            "output_tokens_per_s": tps,
            "median_decode_tps": load.get("median_decode_tps"),
            "usd_per_1m_tokens_mirrored_load": per_m,
        }
    return out
