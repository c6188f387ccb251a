"""Capacity at the SLO, per arm, with a bootstrap interval across conversations, the ratio of
the two arms and the cost per million output tokens at capacity.

A step *passes* when the share of its requests meeting every SLO is at least the attainment
target (0.9: the SLO holds at p90). An arm's capacity is its goodput at the last passing step
of the sweep before the first failing one (the sweep is run from low to high load), and the load
of that step is its capacity in offered-load units. The interval resamples whole conversations
within every step (a conversation's turns share a KV cache and a think time, so they are not
independent) and recomputes the same walk, B times; the ratio's interval pairs the two arms'
independent replicates. When no step failed, the capacity is a lower bound (the ceiling).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from evaluators.capacity.goodput import Sample, StepStats, session_table, step_stats
from evaluators.capacity.slo import Slo

DRIVEN = "alternating steps: at every load the two arms run one after the other, order swapped"


class StepData(msgspec.Struct, frozen=True, kw_only=True):
    """What the driver measured at one step of one arm."""

    load: int
    duration_s: float
    samples: list[Sample]
    prefix_cache_hit_rate: float | None = None


class ArmInput(msgspec.Struct, frozen=True, kw_only=True):
    """One arm as the driver ran it."""

    endpoint: str
    url: str
    steps: list[StepData]
    usd_per_hour: float | None = None  # price_per_hour_usd x gpus


class ArmEstimate(msgspec.Struct, frozen=True, kw_only=True):
    arm: str  # candidate | reference
    endpoint: str
    url: str
    steps: list[StepStats]
    capacity: float | None  # goodput (req/s) at the SLO
    capacity_low: float | None
    capacity_high: float | None
    capacity_load: int | None  # the offered load at capacity
    capacity_load_low: int | None
    capacity_load_high: int | None
    broke_at: int | None  # the first failing load, None when the ceiling was reached first
    output_tokens_per_s: float | None  # at capacity
    usd_per_hour: float | None
    usd_per_1m_tokens: float | None  # at capacity


class CapacityResult(msgspec.Struct, frozen=True, kw_only=True):
    candidate: ArmEstimate
    reference: ArmEstimate
    slo: str
    attainment: float
    load_unit: str
    driven: str
    confidence: float
    bootstrap: int
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    notes: list[str]


def _walk(att: np.ndarray, target: float) -> np.ndarray:
    """Per replicate (rows): index of the last passing step before the first failure, or -1."""
    passing = att >= target
    failed_before = np.cumsum(~passing, axis=-1) > 0
    ok = passing & ~failed_before
    # the last True of a prefix-of-Trues row is its count - 1
    return np.asarray(ok.sum(axis=-1) - 1)


def estimate_arm(
    arm: str,
    endpoint: str,
    url: str,
    steps: Sequence[StepData],
    slo: Slo,
    *,
    attainment: float,
    usd_per_hour: float | None,
    n_boot: int,
    confidence: float,
    rng: np.random.Generator,
) -> tuple[ArmEstimate, np.ndarray]:
    """The arm's estimate and its bootstrap replicates of capacity (goodput, 0 when none)."""
    steps = sorted(steps, key=lambda s: s.load)
    stats = [
        step_stats(
            s.samples,
            load=s.load,
            duration_s=s.duration_s,
            slo=slo,
            prefix_cache_hit_rate=s.prefix_cache_hit_rate,
        )
        for s in steps
    ]
    loads = [s.load for s in steps]
    if not steps:
        empty = ArmEstimate(
            arm=arm, endpoint=endpoint, url=url, steps=[], capacity=None, capacity_low=None,
            capacity_high=None, capacity_load=None, capacity_load_low=None,
            capacity_load_high=None, broke_at=None, output_tokens_per_s=None,
            usd_per_hour=usd_per_hour, usd_per_1m_tokens=None,
        )  # fmt: skip
        return empty, np.zeros(n_boot)
    att = np.array([s.attainment for s in stats])
    point = int(_walk(att[None, :], attainment)[0])
    # Bootstrap: resample conversations within each step.
    b_att = np.zeros((n_boot, len(steps)))
    b_gp = np.zeros((n_boot, len(steps)))
    for j, s in enumerate(steps):
        n, g = session_table(s.samples, slo)
        if n.size == 0:
            continue
        idx = rng.integers(0, n.size, size=(n_boot, n.size))
        tot, good = n[idx].sum(axis=1), g[idx].sum(axis=1)
        b_att[:, j] = np.where(tot > 0, good / np.maximum(tot, 1), 0.0)
        b_gp[:, j] = good / max(s.duration_s, 1e-9)
    b_idx = _walk(b_att, attainment)
    b_cap = np.where(b_idx >= 0, b_gp[np.arange(n_boot), np.maximum(b_idx, 0)], 0.0)
    b_load = np.where(b_idx >= 0, np.asarray(loads)[np.maximum(b_idx, 0)], 0)
    alpha = (1.0 - confidence) / 2.0
    failing = [i for i, s in enumerate(stats) if s.attainment < attainment]
    at = stats[point] if point >= 0 else None
    tps = at.output_tokens_per_s if at is not None else None
    per_m = None
    if usd_per_hour and tps:
        per_m = usd_per_hour / 3600.0 / tps * 1e6
    lo_load, hi_load = np.quantile(b_load, [alpha, 1 - alpha], method="inverted_cdf")
    est = ArmEstimate(
        arm=arm,
        endpoint=endpoint,
        url=url,
        steps=stats,
        capacity=at.goodput if at is not None else 0.0,
        capacity_low=float(np.quantile(b_cap, alpha)),
        capacity_high=float(np.quantile(b_cap, 1 - alpha)),
        capacity_load=at.load if at is not None else None,
        capacity_load_low=int(lo_load) or None,
        capacity_load_high=int(hi_load) or None,
        broke_at=stats[failing[0]].load if failing else None,
        output_tokens_per_s=tps,
        usd_per_hour=usd_per_hour,
        usd_per_1m_tokens=per_m,
    )
    return est, b_cap


def estimate(
    candidate: ArmInput,
    reference: ArmInput,
    slo: Slo,
    *,
    attainment: float = 0.9,
    load_unit: str = "sessions",
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> CapacityResult:
    """Both arms' estimates and the capacity ratio."""
    rng = np.random.default_rng(seed)
    estimates = [
        estimate_arm(
            name,
            a.endpoint,
            a.url,
            a.steps,
            slo,
            attainment=attainment,
            usd_per_hour=a.usd_per_hour,
            n_boot=n_boot,
            confidence=confidence,
            rng=rng,
        )
        for name, a in (("candidate", candidate), ("reference", reference))
    ]
    (cand, b_c), (ref, b_r) = estimates
    ratio = lo = hi = None
    if cand.capacity is not None and ref.capacity:
        ratio = cand.capacity / ref.capacity
        keep = b_r > 0
        if keep.any():
            r = b_c[keep] / b_r[keep]
            alpha = (1.0 - confidence) / 2.0
            lo, hi = float(np.quantile(r, alpha)), float(np.quantile(r, 1 - alpha))
    notes = []
    for a in (cand, ref):
        if a.steps and a.broke_at is None:
            notes.append(
                f"{a.arm} {a.endpoint}: no step broke the SLO up to load {a.steps[-1].load}; "
                "its capacity is a lower bound"
            )
        if a.steps and a.capacity_load is None:
            notes.append(f"{a.arm} {a.endpoint}: the SLO broke at the lowest load already")
    return CapacityResult(
        candidate=cand,
        reference=ref,
        slo=slo.label(),
        attainment=attainment,
        load_unit=load_unit,
        driven=DRIVEN,
        confidence=confidence,
        bootstrap=n_boot,
        ratio=ratio,
        ratio_low=lo,
        ratio_high=hi,
        notes=notes,
    )
