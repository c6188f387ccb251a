"""A whole ramp in simulated time: the controller's pure decision (`evaluators.rollout.rule`) read
every `interval_s` on `rollout_traffic`'s requests, and the workers' guard rule on the candidate's
request stream, for many runs at once (numpy, no servers).

Each step is simulated from its start with the sessions that begin in it (the controller's tests
count only those; a previous step's sessions finishing their turns are left out of the guard's
stream too, a slight undercount of what the guard sees). A look at time t holds every request
ended by t: per session, its summaries over the turns ended so far, summed per arm by adding each
turn's change to the sums when it ends (so a look costs a cumulative sum, not a pass over the
sessions). The guard is modelled on one worker that sees every candidate request of the step in
the order they end, with the config's defaults: `guard_consecutive_failures` failures in a row,
or `guard_burst_failures` among the last `guard_burst_window`, trip it at that request's end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench._shared.rollout_traffic import FAIL_P, RATE, TTFT_SD, StepTraffic, step_traffic
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.rule import (
    ADVANCE,
    HOLD,
    MEANS,
    ROLLBACK,
    ArmSums,
    LookStats,
    judge_look,
    plan_rollout,
)
from gateway.config.sections import RolloutConfig

F = NDArray[np.float64]
STEPS = (1.0, 5.0, 25.0, 50.0, 100.0)
ROLLOUT = RolloutConfig()


def _running_means(
    tr: StepTraffic, names: tuple[str, ...], slo_ttft_s: float, slo_e2e_s: float
) -> dict[str, F]:
    """Each named mean summary after k turns ended, turn-major: (turns, runs, sessions), k =
    1..T on the first axis; NaN when undefined."""
    ok = np.moveaxis(tr.ok, -1, 0)
    ttft = np.moveaxis(tr.ttft_s, -1, 0)
    e2e = np.moveaxis(tr.e2e_s, -1, 0)
    answered = ok & np.isfinite(ttft)
    turns = ok.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        log_ttft = np.where(answered, np.log(ttft), 0.0) if "ttft" in names else None

    def source(name: str) -> tuple[F, NDArray[np.bool_]]:
        with np.errstate(invalid="ignore", divide="ignore"):
            if name in ("ttft", "ttft_first", "ttft_later"):
                x = log_ttft if log_ttft is not None else np.where(answered, np.log(ttft), 0.0)
                use = answered.copy()
                if name == "ttft_first":
                    use[1:] = False
                elif name == "ttft_later":
                    use[0] = False
                return x, use
            if name == "e2e":
                return np.where(answered, np.log(e2e), 0.0), answered
            if name == "failure":
                return (~ok).astype(np.float64), np.ones(ok.shape, dtype=bool)
            if name == "ttft_slo":
                return (ttft > slo_ttft_s).astype(np.float64), answered
            return (e2e > slo_e2e_s).astype(np.float64), answered

    out = {}
    for name in names:
        x, use = source(name)
        num = np.where(use, x, 0.0)
        den = use.astype(np.float64)
        for k in range(1, turns):
            num[k] += num[k - 1]
            den[k] += den[k - 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = np.where(den > 0, num / den, np.nan)
    return out


def look_stats_at(
    tr: StepTraffic, looks_s: F, settings: VerdictSettings, names: tuple[str, ...] = MEANS
) -> LookStats:
    """The controller's statistics at each look time (runs x looks)."""
    runs, n, turns = tr.end_s.shape
    n_looks = len(looks_s)
    # Look j (0-based) holds the requests ended by looks_s[j]; n_looks: after the last look.
    bins = np.searchsorted(looks_s, np.moveaxis(tr.end_s, -1, 0), side="left")
    index = (np.arange(runs)[None, :, None] * (n_looks + 1) + bins) * 2
    index += ~tr.candidate[None, :, :]  # 0: candidate, 1: production
    flat = index.ravel()
    size = 2 * runs * (n_looks + 1)

    def cum(weights: F) -> tuple[F, F]:
        b = np.bincount(flat, weights=weights.ravel(), minlength=size)
        c = np.cumsum(b.reshape(runs, n_looks + 1, 2), axis=1)[:, :n_looks]
        return c[..., 0], c[..., 1]

    values = _running_means(tr, names, settings.slo_ttft_s, settings.slo_e2e_s)
    sums: tuple[dict[str, ArmSums], dict[str, ArmSums]] = ({}, {})
    for name in names:
        v = values[name]
        valid = np.isfinite(v)
        x = np.where(valid, v, 0.0)
        d_n = valid.astype(np.float64)
        d_1 = x.copy()
        d_2 = x * x
        d_n[1:] -= d_n[:-1].copy()
        d_1[1:] -= x[:-1]
        d_2[1:] -= (x * x)[:-1]
        (n_c, n_p), (a_c, a_p), (q_c, q_p) = cum(d_n), cum(d_1), cum(d_2)
        sums[0][name] = ArmSums(n_c, a_c, q_c)
        sums[1][name] = ArmSums(n_p, a_p, q_p)
    # A session begins (for the controller) when its first turn is stored; it is failing from
    # its first failed turn on.
    began = np.zeros((turns, runs, n))
    began[0] = 1.0
    failed = np.moveaxis(~tr.ok, -1, 0)
    first_fail = (failed & (np.cumsum(failed, axis=0) == 1)).astype(np.float64)
    s_c, s_p = cum(began)
    f_c, f_p = cum(first_fail)
    return LookStats(sums[0], sums[1], s_c, s_p, f_c, f_p)


def guard_trip_s(tr: StepTraffic, config: RolloutConfig = ROLLOUT) -> F:
    """When one worker's guard trips on each run's candidate requests (inf: never)."""
    runs = tr.end_s.shape[0]
    cand = np.broadcast_to(tr.candidate[..., None], tr.end_s.shape).reshape(runs, -1)
    end = np.where(
        cand & np.isfinite(tr.end_s.reshape(runs, -1)), tr.end_s.reshape(runs, -1), np.inf
    )
    order = np.argsort(end, axis=1)
    t = np.take_along_axis(end, order, axis=1)
    f = np.take_along_axis((~tr.ok).reshape(runs, -1) & cand, order, axis=1) & np.isfinite(t)
    c = np.cumsum(f, axis=1)
    # Consecutive: failures since the last success.
    last_ok = np.maximum.accumulate(np.where(~f & np.isfinite(t), c, 0), axis=1)
    streak_trip = (c - last_ok) >= config.guard_consecutive_failures
    win = config.guard_burst_window
    shifted = np.concatenate([np.zeros((runs, win), c.dtype), c[:, :-win]], axis=1)
    burst_trip = (c - shifted) >= config.guard_burst_failures
    trip = (streak_trip | burst_trip) & np.isfinite(t)
    at = np.argmax(trip, axis=1)
    out: F = np.where(trip.any(axis=1), t[np.arange(runs), at], np.inf)
    return out


@dataclass
class RolloutOutcome:
    """Per run: how the ramp ended, at which step (index into its steps), after how long, and
    each step's time (NaN where a run never reached it)."""

    state: NDArray[np.str_]
    step: NDArray[np.int64]
    seconds: F
    by_guard: NDArray[np.bool_]
    step_seconds: F  # (steps, runs)


# Seconds of a step judged first on the sessions begun by then (most harm is caught sooner).
EARLY_S = 240.0


def _prefix(tr: StepTraffic, rows: NDArray[np.intp], until_s: float) -> StepTraffic:
    """The runs `rows` with only the sessions that began before `until_s` (sessions are in
    order of their start)."""
    m = int(np.max(np.sum(tr.start_s[rows] < until_s, axis=1), initial=0)) + 1
    return StepTraffic(
        tr.start_s[rows, :m],
        tr.candidate[rows, :m],
        tr.end_s[rows, :m],
        tr.ok[rows, :m],
        tr.ttft_s[rows, :m],
        tr.e2e_s[rows, :m],
    )


def simulate_rollout(
    seed: int,
    *,
    runs: int = 200,
    harm: str = "",
    harm_step: int = 0,
    steps: tuple[float, ...] = STEPS,
    settings: VerdictSettings | None = None,
    min_step_s: float = ROLLOUT.default_min_step_s,
    interval_s: float = ROLLOUT.controller_interval_s,
    until_step: int | None = None,
    before: RolloutOutcome | None = None,
    guard: Callable[[StepTraffic], F] | None = None,
) -> RolloutOutcome:
    """`runs` ramps through `steps`; `harm` ("ttft" or "failures") appears on the candidate
    from step index `harm_step` on; the ramp stops after step index `until_step` (default: the
    last). With `before` (a harmless simulation of the same ramp), the runs keep its history up
    to `harm_step` and only the steps from there are simulated (the same distribution: a step's
    evidence is its own). `guard` gives each run's guard trip time on a step's traffic
    (default `guard_trip_s`, which counts requests: the workers' guard counts failing sessions
    for a burst, which never trips sooner, so the default is an upper bound of its trips)."""
    s = settings or VerdictSettings()
    rng = np.random.default_rng(seed)
    plan = plan_rollout(
        steps,
        sessions_per_s=RATE,
        noise=TTFT_SD,
        failing_share=FAIL_P,
        min_step_s=min_step_s,
        settings=s,
        turn_span_s=30.0,
    )
    first = 0
    if before is None:
        state = np.full(runs, "running", dtype=object)
        step_at = np.zeros(runs, dtype=np.int64)
        by_guard = np.zeros(runs, dtype=bool)
        durations = np.full((len(steps), runs), np.nan)
    else:
        first = harm_step
        reached = before.step >= harm_step
        state = np.where(reached, "running", before.state).astype(object)
        step_at = np.where(reached, harm_step, before.step)
        by_guard = np.where(reached, False, before.by_guard)
        durations = before.step_seconds.copy()
        durations[harm_step:, reached] = np.nan
    last = len(steps) - 1 if until_step is None else until_step
    largest = max(x for x in steps if x < 100.0)
    for k in range(first, last + 1):
        pct = steps[k]
        alive = np.flatnonzero(state == "running")
        if len(alive) == 0:
            break
        harmed = bool(harm) and k >= harm_step
        cap = 1.1 * plan[k].seconds + 60.0
        tr = step_traffic(
            rng,
            runs=len(alive),
            duration_s=cap,
            weight=pct / 100.0,
            ttft_factor=1.3 if harmed and harm == "ttft" else 1.0,
            fail_p_candidate=0.05 if harmed and harm == "failures" else FAIL_P,
        )
        looks = np.arange(interval_s, cap + interval_s / 2, interval_s)
        if pct >= 100.0:
            act = np.where(looks >= min_step_s, ADVANCE, 0)[None, :].repeat(len(alive), 0)
        else:
            names = MEANS if pct == largest else ("ttft", "e2e")
            act = np.zeros((len(alive), len(looks)), dtype=np.int8)
            # Looks up to `early` s depend only on the sessions that began by then: judge those
            # first on every run, then the whole step only on runs still undecided (exact).
            early = min(cap, EARLY_S)
            rows = np.arange(len(alive))
            for until in (early, cap):
                few = looks[looks <= until]
                part = _prefix(tr, rows, until)
                act[np.ix_(rows, np.arange(len(few)))] = judge_look(
                    look_stats_at(part, few, s, names), weight_pct=pct, steps=steps,
                    elapsed_s=few[None, :], min_step_s=min_step_s, settings=s,
                ).action  # fmt: skip
                rows = rows[~np.any(act[rows] != 0, axis=1)]
                if len(rows) == 0:
                    break
        decided = act != 0
        at = np.argmax(decided, axis=1)
        t_dec = np.where(decided.any(axis=1), looks[at], np.inf)
        a_dec = np.where(decided.any(axis=1), act[np.arange(len(alive)), at], 0)
        t_guard = (guard or guard_trip_s)(tr)
        guard_first = t_guard < t_dec
        t_end = np.minimum(t_dec, t_guard)
        durations[k, alive] = np.where(np.isfinite(t_end), t_end, cap)
        step_at[alive] = k
        state[alive] = np.where(
            guard_first,
            "rolled_back",
            np.select(
                [a_dec == ROLLBACK, a_dec == HOLD, a_dec == ADVANCE],
                ["rolled_back", "held", "completed" if k == len(steps) - 1 else "running"],
                "stuck",
            ),
        )
        by_guard[alive] = guard_first
    seconds = np.nansum(durations, axis=0)
    return RolloutOutcome(state.astype(str), step_at, seconds, by_guard, durations)


def rolled_back_by(out: RolloutOutcome, step: int) -> float:
    """Share of runs rolled back at or before step index `step`."""
    return float(np.mean((out.state == "rolled_back") & (out.step <= step)))


def planned_seconds(settings: VerdictSettings | None = None) -> float:
    """`canary plan`'s expected time of the default ramp in this world (its rate and noise)."""
    plan = plan_rollout(
        STEPS,
        sessions_per_s=RATE,
        noise=TTFT_SD,
        failing_share=FAIL_P,
        min_step_s=ROLLOUT.default_min_step_s,
        settings=settings or VerdictSettings(),
        turn_span_s=30.0,
    )
    return math.fsum(p.seconds for p in plan)
