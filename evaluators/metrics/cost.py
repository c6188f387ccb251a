"""Cost evaluator: dollars per output token, candidate relative to the live endpoint.

Cost per output token = price_per_hour_usd × gpus / output tokens per hour. Capacity cannot be
measured from mirrored traffic (each arm only carries the sampled load), so the ratio assumes
both would be run at the same concurrency and takes throughput ∝ per-request decode speed:
per pair, log(cost ratio) = log(price×gpus ratio) + log(TPOT_candidate / TPOT_reference), with
the decode-speed reference the control when present. The goal of a `quantized` candidate.

When the candidate has a `canary capacity` result younger than CAPACITY_MAX_AGE_S (a week,
`domain.capture`), the metric uses it instead (and says so): cost ratio = price ratio /
capacity ratio, i.e. dollars per request served within the SLO at each arm's measured
capacity, with the run's bootstrap interval; the goal is shown when the interval lies below it.
"""

from __future__ import annotations

import math

import msgspec

from domain import kinds
from domain.capture import CapacitySummary
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
from evaluators.metrics import tokens
from evaluators.metrics.latency import NO_SAME_LOAD, both_ok, log_ratio
from evaluators.metrics.throughput import Row

CAVEAT = (
    "mirrored-load throughput is not capacity: each arm only carried the sampled traffic, so "
    "$/1M tokens at mirrored load overstates cost; the cost ratio assumes equal concurrency "
    "and throughput proportional to per-request decode speed"
)


def caveat(ctx: EvalContext) -> str:
    """The report's cost caveat: the estimate's, or the capacity run it rests on."""
    cap = ctx.capacity
    if cap is not None and _capacity_usable(ctx, cap) is not None:
        return (
            f"cost rests on the capacity run #{cap.id} (canary capacity, SLO {cap.slo}, "
            f"reference {cap.reference}): measured capacity on replayed sessions, not the "
            "mirrored load; its interval is a bootstrap across conversations, not always-valid"
        )
    return CAVEAT


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


class _Arm(msgspec.Struct):
    usd_per_hour: float | None = None
    usd_per_1m_tokens: float | None = None
    steps: list[dict[str, object]] = msgspec.field(default_factory=list)


class _Run(msgspec.Struct):
    candidate: _Arm
    reference: _Arm


def _capacity_usable(ctx: EvalContext, cap: CapacitySummary) -> tuple[float, _Run] | None:
    """(price ratio, the run) when the run has a ratio with an interval and both prices."""
    if not (cap.ratio and cap.ratio_low and cap.ratio_high):
        return None
    try:
        run = msgspec.json.decode(cap.result_json, type=_Run)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    price_c = hourly(ctx.candidate) or run.candidate.usd_per_hour
    price_r = run.reference.usd_per_hour
    if not price_c or not price_r:
        return None
    return price_c / price_r, run


def _from_capacity(spec: MetricSpec, ctx: EvalContext, cap: CapacitySummary) -> MetricResult | None:
    usable = _capacity_usable(ctx, cap)
    if usable is None or cap.ratio is None or cap.ratio_low is None or cap.ratio_high is None:
        return None
    price_ratio, run = usable
    est = price_ratio / cap.ratio
    low, high = price_ratio / cap.ratio_high, price_ratio / cap.ratio_low
    requests = sum(int(str(s.get("requests", 0))) for s in run.candidate.steps)
    shown = spec.goal is not None and high < spec.goal
    return MetricResult(
        name=spec.name,
        label=spec.label,
        role=spec.role,
        harm=spec.harm,
        scale=spec.scale,
        unit=spec.unit,
        reference=f"capacity:{cap.reference}",
        n=requests,
        estimate=est,
        ci_low=low,
        ci_high=high,
        goal=spec.goal,
        status="undecided",  # judged with the other metrics by evaluators.judge.verdict
        # The bootstrap interval is two-sided at 95 %: wholly below the goal is shown at 2.5 %.
        p_goal=(ctx.settings.alpha / 2 if shown else 1.0) if spec.goal is not None else None,
        detail={
            "source": "capacity",
            "capacity_run": cap.id,
            "measured_at": cap.created_at,
            "slo": cap.slo,
            "price_ratio": price_ratio,
            "capacity_ratio": cap.ratio,
            "usd_per_1m_tokens": cap.usd_per_1m_tokens,
            "reference_usd_per_1m_tokens": cap.reference_usd_per_1m_tokens,
        },
        notes=[
            f"from capacity run #{cap.id} against {cap.reference} at SLO {cap.slo}: "
            f"price ratio {price_ratio:.3g} / capacity ratio {cap.ratio:.3g} "
            f"[{cap.ratio_low:.3g}, {cap.ratio_high:.3g}]"
        ],
    )


def cost(ctx: EvalContext) -> list[MetricResult]:
    """Cost per output token, candidate / live (or / the capacity reference, measured)."""
    spec = cost_spec(ctx.settings, ctx.candidate.kind)
    if ctx.capacity is not None and (measured := _from_capacity(spec, ctx, ctx.capacity)):
        return [measured]
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
    counted = tokens.counted(cand, ref, ok)
    x, use = log_ratio(cand.tpot_s, ref.tpot_s, counted)
    if len(x) == 0:
        why = "no pair with more than one output token counted one way on both arms"
        return [tokens.gate_on_counts(empty_result(spec, ctx.reference, why), ok, counted)]
    x = x + math.log(price_c / price_l)
    detail: Detail = {"price_ratio": price_c / price_l}
    res = judge_mean(spec, x, ctx, use=use, reference=ctx.reference, detail=detail)
    res = res if ctx.has_control else ungate(res, NO_SAME_LOAD, blocks=True)
    return [tokens.gate_on_counts(res, ok, counted)]


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
