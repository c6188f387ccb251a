"""Throughput evaluators: decode speed per request, and the load each arm carried.

Decode speed is tokens per second after the first token (1 / TPOT), per request, on pairs whose
two answers were counted by one tokenizer (an SSE event is not a token). The load table
is what makes a latency comparison interpretable: requests, failures, mean concurrency (Little's
law: total time in flight / window) and aggregate output tokens per second of each arm over the
window. Mirrored-load throughput is what the arm was asked to do, not what it can do.
"""

from __future__ import annotations

import numpy as np

from evaluators.judge.metric import EvalContext, MetricResult, MetricSpec, empty_result, judge_mean
from evaluators.metrics import tokens
from evaluators.metrics.latency import both_ok, hl_detail, log_ratio
from evaluators.pairs.types import PairSet

Row = dict[str, float | int | str | list[float] | None]
# Percentiles of each arm's latency CDF kept in the report (dense in the tail).
CDF_LEVELS = (0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 99.9, 100)


def decode_speed(ctx: EvalContext) -> list[MetricResult]:
    """Decode tokens/s per request, candidate / reference (higher is better)."""
    s = ctx.settings
    spec = MetricSpec(
        name="decode_speed",
        label="decode tokens/s",
        role="diagnostic",
        harm="lower",
        scale="ratio",
        delta=s.latency_delta,
        unit="ratio",
    )
    cand, ref, ok = both_ok(ctx)
    # speed ratio = reference TPOT / candidate TPOT, on pairs counted one way
    x, use = log_ratio(ref.tpot_s, cand.tpot_s, tokens.counted(cand, ref, ok))
    if len(x) == 0:
        why = "no pair with more than one output token counted one way on both arms"
        return [empty_result(spec, ctx.reference, why)]
    speed_c = 1.0 / cand.tpot_s[use].astype(np.float64)
    speed_r = 1.0 / ref.tpot_s[use].astype(np.float64)
    detail = hl_detail(x, ctx, speed_c, speed_r)
    detail["median_candidate_tps"] = detail.pop("median_candidate_s")
    detail["median_reference_tps"] = detail.pop("median_reference_s")
    return [judge_mean(spec, x, ctx, use=use, reference=ctx.reference, detail=detail)]


def arm_load(pairs: PairSet, name: str) -> Row:
    """Load and speed of one arm over the window (the exchanges' window: copies are sent to
    candidates within their queue wait, so every arm sees the same span)."""
    arm = pairs.arm(name)
    present = arm.present
    n = int(np.count_nonzero(present))
    row: Row = {"requests": n, "ok": int(np.count_nonzero(arm.ok))}
    if n == 0:
        return row
    start = pairs.received_at[present]
    e2e = np.nan_to_num(arm.e2e_s[present].astype(np.float64), nan=0.0)
    span = float(np.max(start + e2e) - np.min(start))
    counted = arm.ok & (arm.counter != 0)  # output tokens counted from the text
    n_ok, n_counted = int(np.count_nonzero(arm.ok)), int(np.count_nonzero(counted))
    # Tokens of the answered requests: the counted mean times the answered (None when too few
    # were counted for the mean to stand for the rest).
    n_tokens: float | None = None
    if n_counted and n_counted >= tokens.MIN_COUNTED_SHARE * n_ok:
        n_tokens = float(np.nanmean(arm.output_tokens[counted], dtype=np.float64)) * n_ok
    tpot = arm.tpot_s[arm.ok]
    tpot = tpot[np.isfinite(tpot) & (tpot > 0)]
    wait = arm.queue_wait_s[present]
    wait = wait[np.isfinite(wait)]
    row.update(
        error_rate=1.0 - row["ok"] / n,  # type: ignore[operator]
        window_s=span,
        requests_per_s=n / span if span > 0 else None,
        mean_concurrency=float(np.sum(e2e)) / span if span > 0 else None,
        output_tokens_per_s=n_tokens / span if span > 0 and n_tokens is not None else None,
        median_decode_tps=float(np.median(1.0 / tpot)) if len(tpot) else None,
        mean_queue_wait_s=float(np.mean(wait)) if len(wait) else None,
    )
    for field in ("ttft", "e2e"):
        values = getattr(arm, f"{field}_s")[arm.ok]
        values = values[np.isfinite(values)]
        if len(values):
            row[f"{field}_cdf"] = [float(v) for v in np.percentile(values, CDF_LEVELS)]
    return row


def arms_load(pairs: PairSet) -> dict[str, Row]:
    """The load table: one row per arm present in the PairSet."""
    arms = ["production", "candidate"] + (["control"] if pairs.has_control else [])
    rows = {}
    for name in arms:
        rows[name] = arm_load(pairs, name)
        pairs.release()  # a spilled window holds one arm's columns at a time
    return rows
