"""The ramp's decision rule: small steps look for harm, the largest split step asks
non-inferiority once, and every step's dwell is sized by power (STATISTICS.md, "The ramp's two
questions"; Schultzberg et al., Spotify 2024: deterioration tests on every metric at every look,
non-inferiority where the data can answer it, and the error rate of the whole decision rule).

**Error of the whole ramp.** A false rollback of a candidate that is production's equal is the
error the ramp spends. The workers' guards keep `GUARD_SHARE` of `alpha` for their false trips
(`evaluators.rollout.guards` states them; the defaults stay within it at the documented world);
the rest is split evenly (Bonferroni) over the deterioration tests of every split step (weight
< 100 %). Each test is anytime-valid, so every look of every step is covered: P(a test's false
rollback) <= alpha (1 - GUARD_SHARE), and with the guards' trips at most alpha.

**Deterioration** (is the candidate worse? one-sided, against no difference, at every look):

* `ttft`, `e2e` — each session's mean log TTFT (E2E) over its answered turns; the two-sample
  normal mixture of `twosample.diff_of_means` in information time, tuned to the information the
  step is planned to reach; harm when its lower bound is above 0.
* `failing` — the share of sessions with a failed request, by a randomization test: a session's
  arm is drawn by hash with probability w (the step's weight) whatever its outcome, so while the
  candidate is not worse each failing session is the candidate's with probability <= w. The
  mixture over relative risks `RISKS` of the likelihood ratios of the candidate's count among
  the failing sessions is a nonnegative supermartingale in the order sessions first fail; harm
  when it reaches 1/alpha (Ville). Exact at any count (no normal approximation at a 2 % share)
  and it uses every session of both arms.

Only sessions whose first turn came in the step count (their arm was drawn at its weight).

**Dwell.** A split step advances when no test shows harm, `min_step_s` has passed, and it has
seen the sessions that give each planted harm it is sized for a rollback by then with
`ramp_power`: TTFT x `ramp_ttft_harm` from `ramp_ttft_from` %, failing sessions
+`ramp_failure_harm` from `ramp_failure_from` %, at the noise and failing share measured on the
step's own production arm (which the candidate cannot move). A step below both is a smoke test
of `min_step_s`: the next sized step catches a harm that appeared there. Reading the tests at
every look and stopping at a data-dependent size is what anytime validity allows.

**Non-inferiority**, asked once at the largest split step (50 % by default, where the arms are
equal): when every summary's information reaches the sessions for a candidate equal to
production to be shown within its margin with `ramp_ni_power`, a fixed-sample one-sided z-test
at alpha per summary (an intersection-union test: no correction across summaries). All within:
advance. Otherwise the ramp holds (pauses for a person), since no harm was shown but the margin
was not either: resuming answers the margins (the step then advances, still watched for harm),
aborting ends it. The mirror's paired verdict answered the same question
on the same requests before the ramp; this confirms it under real load.

**Approximations, and what checks them.** A look summarizes each session over the turns ended
so far, so a session's value moves until its last turn (the sums are not strictly those of a
growing prefix of finished units). The mean tests are tuned to, and the non-inferiority look is
taken at, a size computed from the production arm's measured variance: a data-dependent choice,
but of a statistic the candidate cannot move and that is (for normal data) independent of the
arms' means, as in an internal-pilot sample-size re-estimation. The failing test is exact. The
whole rule is checked, not assumed, on an independent generator: 200 A/A ramps read every 2 s
are rolled back in 2.5 % (bench/RESULTS.md, tests/evaluators/test_rollout_rule.py).

**100 %** has no production arm of new sessions: no test, complete after `min_step_s`; the
workers' guards and the last split step's evidence protect it. Pure numpy/scipy; never does IO.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special, stats

from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import SessionUnits
from evaluators.rollout.guards import GUARD_SHARE
from evaluators.rollout.twosample import (
    Comparison,
    Decision,
    Scale,
    diff_of_means,
    mixture_boundary,
)

F = NDArray[np.float64]
B = NDArray[np.bool_]

DETERIORATION = ("ttft", "e2e", "failing")
# Summaries of the non-inferiority look, each with the margin field it is held to.
NON_INFERIORITY = {
    "ttft_first": "latency_delta",
    "ttft_later": "latency_delta",
    "e2e": "latency_delta",
    "failure": "error_delta",
    "ttft_slo": "slo_exceedance_delta",
    "e2e_slo": "slo_exceedance_delta",
}
MEANS = ("ttft", *NON_INFERIORITY)
# Relative risks (candidate / production failing share) the failing test's mixture averages.
RISKS = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
# Action codes, indexing ACTIONS: "hold" pauses the ramp for a person.
WAIT, ADVANCE, ROLLBACK, HOLD = 0, 1, 2, 3
ACTIONS = ("wait", "advance", "rollback", "hold")
# Largest dwell sized, in sessions (beyond it a step cannot reach its power).
MAX_SESSIONS = 10_000_000.0


@dataclass(frozen=True, slots=True)
class ArmSums:
    """One arm's count, sum and sum of squares of a per-session summary (any shape)."""

    n: F
    s1: F
    s2: F

    def var(self) -> F:
        """Sample variance (NaN below 2 sessions)."""
        n = np.maximum(self.n, 1.0)
        mean = self.s1 / n
        v: F = np.where(self.n >= 2, (self.s2 - n * mean**2) / np.maximum(n - 1.0, 1.0), np.nan)
        return np.maximum(v, 0.0)


@dataclass(frozen=True, slots=True)
class LookStats:
    """What a look needs, per arm: the sums of every mean summary, the sessions that began in
    the step and those of them with a failed request. Arrays of one shape (runs x looks in a
    simulation, () live)."""

    candidate: dict[str, ArmSums]
    production: dict[str, ArmSums]
    sessions_c: F
    sessions_p: F
    failing_c: F
    failing_p: F


def look_stats(units: SessionUnits, began: B) -> LookStats:
    """A live look's statistics from its per-session units; `began` marks the sessions whose
    first turn came in the step (the others are left out)."""

    def sums(arm: B) -> dict[str, ArmSums]:
        out = {}
        for name in MEANS:
            x = units.values[name][arm]
            x = x[np.isfinite(x)]
            out[name] = ArmSums(
                np.asarray(float(len(x))), np.asarray(float(x.sum())), np.asarray(float(x @ x))
            )
        return out

    cand = units.candidate & began
    prod = ~units.candidate & began
    failing = np.nan_to_num(units.values["failure"], nan=0.0) > 0

    def count(mask: B) -> F:
        return np.asarray(float(np.count_nonzero(mask)))

    return LookStats(
        sums(cand),
        sums(prod),
        count(cand),
        count(prod),
        count(cand & failing),
        count(prod & failing),
    )


def harm_alpha(settings: VerdictSettings, steps: Sequence[float]) -> float:
    """The level of each deterioration test: the tests' share of alpha (the guards keep
    `GUARD_SHARE` of it) over every test of every split step."""
    split = sum(1 for s in steps if s < 100.0)
    return settings.alpha * (1.0 - GUARD_SHARE) / (len(DETERIORATION) * max(split, 1))


@functools.lru_cache(maxsize=64)
def _information_table(alpha: float, power: float) -> tuple[F, F]:
    """(log g(u), log u) for u log-spaced: g(u) = B(u)/u + z_power/sqrt(u), the smallest
    standardized effect the mixture tuned to u rejects by u with `power`; g decreases."""
    u = np.geomspace(2.0, 1e9, 2000)
    g = mixture_boundary(u, u, alpha) / u + float(special.ndtri(power)) / np.sqrt(u)
    return np.log(g[::-1]), np.log(u[::-1])


def information_needed(effect_sd: F | float, alpha: float, power: float) -> F:
    """Information (units of the difference's variance) at which a test tuned to it rejects an
    effect of `effect_sd` standard deviations (of one candidate-minus-production unit) with
    probability `power`."""
    log_g, log_u = _information_table(alpha, power)
    rho = np.maximum(np.asarray(effect_sd, dtype=np.float64), 1e-9)
    out: F = np.exp(np.interp(np.log(rho), log_g, log_u, left=math.log(1e9), right=math.log(2.0)))
    return out


def mean_sessions(weight: float, noise: F | float, effect: float, alpha: float, power: float) -> F:
    """Sessions (both arms) for a one-sided mixture test at `alpha` to catch a mean shift
    `effect` with `power`, at a per-session sd `noise` in each arm (information 2w(1-w)n)."""
    sd = np.sqrt(2.0) * np.maximum(np.asarray(noise, dtype=np.float64), 1e-6)
    out: F = information_needed(effect / sd, alpha, power) / (2.0 * weight * (1.0 - weight))
    return out


def _risk_pi(weight: float, risk: float) -> float:
    return weight * risk / (weight * risk + 1.0 - weight)


@functools.lru_cache(maxsize=256)
def _failing_table(weight: float, harm: float, alpha: float, power: float) -> tuple[F, F]:
    """(production failing share grid, sessions needed) for the failing test to catch +harm."""
    grid = np.concatenate([[0.0], np.geomspace(1e-4, 0.5, 80)])
    need = np.full(len(grid), MAX_SESSIONS)
    n = np.arange(1, 20_001, dtype=np.float64)
    for i, p in enumerate(grid):
        pc = min(p + harm, 1.0)
        pi1 = weight * pc / (weight * pc + (1.0 - weight) * p)
        risk = pc / p if p > 0 else math.inf
        # The mixture is at least one of its terms over len(RISKS): the nearest risk's.
        r = min(RISKS, key=lambda x: abs(math.log(x) - math.log(min(risk, 1e6))))
        pj = _risk_pi(weight, r)
        up, down = math.log(pj / weight), math.log((1.0 - pj) / (1.0 - weight))
        m_star = np.ceil((math.log(len(RISKS) / alpha) - n * down) / (up - down))
        caught = stats.binom.sf(m_star - 1.0, n, pi1) >= power
        if caught.any():
            first = n[int(np.argmax(caught))]
            need[i] = first / (weight * pc + (1.0 - weight) * p)
    return grid, need


def failing_sessions(
    weight: float, p_prod: F | float, harm: float, alpha: float, power: float
) -> F:
    """Sessions (both arms) for the failing test at `alpha` to catch the candidate's failing
    share at production's + `harm` with `power` (by the count at that size: conservative)."""
    grid, need = _failing_table(weight, harm, alpha, power)
    p = np.clip(np.asarray(p_prod, dtype=np.float64), 0.0, 0.5)
    out: F = np.exp(np.interp(p, grid, np.log(need)))
    return out


def failing_harm(stats_: LookStats, weight: float, alpha: float) -> tuple[B, F]:
    """(harm, log mixture likelihood ratio) of the failing test at each look."""
    m = stats_.failing_c
    n = stats_.failing_c + stats_.failing_p
    terms = []
    for r in RISKS:
        pj = _risk_pi(weight, r)
        terms.append(m * math.log(pj / weight) + (n - m) * math.log((1.0 - pj) / (1.0 - weight)))
    log_lr: F = special.logsumexp(np.stack(terms), axis=0) - math.log(len(RISKS))
    return log_lr >= math.log(1.0 / alpha), log_lr


@dataclass(frozen=True, slots=True)
class Look:
    """A look's decision (codes per look) and what it rests on."""

    action: NDArray[np.int8]
    harm: dict[str, B]
    sessions: F  # sessions in the step so far (both arms)
    needed: F  # sessions the dwell needs (0 = min_step_s only)
    ni_asked: B
    ni_within: dict[str, B]


def _mean_lower(
    c: ArmSums, p: ArmSums, horizon: F, alpha: float, settings: VerdictSettings
) -> tuple[F, F, F]:
    est, var_unit, t = diff_of_means(
        c.n, c.s1, c.s2, p.n, p.s1, p.s2, sigma_floor=settings.latency_sigma_floor
    )
    lower: F = est - mixture_boundary(t, horizon, alpha) * np.sqrt(var_unit) / t
    return est, lower, t


def judge_look(
    stats_: LookStats,
    *,
    weight_pct: float,
    steps: Sequence[float],
    elapsed_s: F | float,
    min_step_s: float,
    settings: VerdictSettings,
    margins_answered: bool = False,
) -> Look:
    """The action at each look of a step at `weight_pct` % of the ramp `steps` (see the module
    docstring): rollback on any deterioration, hold or advance at the non-inferiority look of
    the largest split step, advance a sized step once it has its sessions, else wait.
    `margins_answered`: a person resumed the ramp after a hold in this step, answering the
    margins; the look then advances instead of holding again."""
    shape = np.shape(stats_.sessions_c)
    sessions = stats_.sessions_c + stats_.sessions_p
    dwell_done = np.broadcast_to(np.asarray(elapsed_s) >= min_step_s, shape)
    none: B = np.zeros(shape, dtype=bool)
    if weight_pct >= 100.0:
        action = np.where(dwell_done, ADVANCE, WAIT).astype(np.int8)
        return Look(action, {}, sessions, np.zeros(shape), none, {})
    w = weight_pct / 100.0
    alpha = harm_alpha(settings, steps)
    floor = settings.min_metric_pairs
    noise = np.sqrt(stats_.production["ttft"].var())
    noise = np.where(np.isfinite(noise), noise, 1.0)
    ttft_effect = math.log(settings.ramp_ttft_harm)
    n_ttft = mean_sessions(w, noise, ttft_effect, alpha, settings.ramp_power)
    horizon = 2.0 * w * (1.0 - w) * n_ttft  # the information the mean tests are tuned to
    harm: dict[str, B] = {}
    for name in ("ttft", "e2e"):
        c, p = stats_.candidate[name], stats_.production[name]
        _, lower, _ = _mean_lower(c, p, horizon, alpha, settings)
        harm[name] = (lower > 0) & (c.n >= floor) & (p.n >= floor)
    harm["failing"] = failing_harm(stats_, w, alpha)[0]

    needed = np.zeros(shape)
    if weight_pct >= settings.ramp_ttft_from:
        # The mean tests declare harm only past `min_metric_pairs` sessions in each arm.
        needed = np.maximum(needed, np.maximum(n_ttft, floor / min(w, 1.0 - w)))
    if weight_pct >= settings.ramp_failure_from:
        p_prod = stats_.failing_p / np.maximum(stats_.sessions_p, 1.0)
        n_fail = failing_sessions(w, p_prod, settings.ramp_failure_harm, alpha, settings.ramp_power)
        needed = np.maximum(needed, n_fail)
    ready = dwell_done & (sessions >= needed)

    ni_within: dict[str, B] = {}
    ni_asked = none
    if weight_pct == max(s for s in steps if s < 100.0):
        z_a = float(special.ndtri(1.0 - settings.alpha))
        z_b = float(special.ndtri(settings.ramp_ni_power))
        info_ok = ready.copy()
        for name, field in NON_INFERIORITY.items():
            margin = _margin(settings, field)
            c, p = stats_.candidate[name], stats_.production[name]
            var_p = p.var()
            info = 1.0 / (1.0 / np.maximum(c.n, 1.0) + 1.0 / np.maximum(p.n, 1.0))
            want = (z_a + z_b) ** 2 * np.nan_to_num(var_p, nan=np.inf) / margin**2
            info_ok &= (info >= want) & (c.n >= floor) & (p.n >= floor)
            est = c.s1 / np.maximum(c.n, 1.0) - p.s1 / np.maximum(p.n, 1.0)
            se = np.sqrt(
                np.nan_to_num(c.var(), nan=np.inf) / np.maximum(c.n, 1.0)
                + np.nan_to_num(var_p, nan=np.inf) / np.maximum(p.n, 1.0)
            )
            ni_within[name] = est + z_a * se < margin
        ni_asked = info_ok
        within = np.all(np.stack(list(ni_within.values())), axis=0)
        held = HOLD if not margins_answered else ADVANCE
        action = np.where(ni_asked, np.where(within, ADVANCE, held), WAIT).astype(np.int8)
    else:
        action = np.where(ready, ADVANCE, WAIT).astype(np.int8)
    action[np.any(np.stack(list(harm.values())), axis=0)] = ROLLBACK
    return Look(action, harm, sessions, needed, ni_asked, ni_within)


def _margin(settings: VerdictSettings, field: str) -> float:
    value = float(getattr(settings, field))
    return math.log(value) if field == "latency_delta" else value


def comparisons(
    stats_: LookStats,
    look: Look,
    *,
    weight_pct: float,
    steps: Sequence[float],
    settings: VerdictSettings,
) -> tuple[Comparison, ...]:
    """A live look's tests as Comparisons (for the event's evidence): the deterioration tests
    (margin 0; lower bound at the harm level) and, at the non-inferiority look, each margin's
    test (upper bound at alpha)."""
    if weight_pct >= 100.0:
        return ()
    w = weight_pct / 100.0
    alpha = harm_alpha(settings, steps)
    floor = settings.min_metric_pairs
    out: list[Comparison] = []
    noise = np.sqrt(stats_.production["ttft"].var())
    n_ttft = mean_sessions(
        w,
        np.where(np.isfinite(noise), noise, 1.0),
        math.log(settings.ramp_ttft_harm),
        alpha,
        settings.ramp_power,
    )
    horizon = 2.0 * w * (1.0 - w) * n_ttft
    for name in ("ttft", "e2e"):
        c, p = stats_.candidate[name], stats_.production[name]
        est, lower, _ = _mean_lower(c, p, horizon, alpha, settings)
        out.append(_comparison(name, look.harm[name], 0.0, c.n, p.n, est, lower, None, floor,
                               "log_ratio"))  # fmt: skip
    share_c = stats_.failing_c / np.maximum(stats_.sessions_c, 1.0)
    share_p = stats_.failing_p / np.maximum(stats_.sessions_p, 1.0)
    out.append(
        _comparison(
            "failing", look.harm["failing"], 0.0, stats_.sessions_c, stats_.sessions_p,
            share_c - share_p, None, None, 1, "share",
        )
    )  # fmt: skip
    if bool(look.ni_asked):
        z_a = float(special.ndtri(1.0 - settings.alpha))
        for name, field in NON_INFERIORITY.items():
            c, p = stats_.candidate[name], stats_.production[name]
            est = c.s1 / np.maximum(c.n, 1.0) - p.s1 / np.maximum(p.n, 1.0)
            se = np.sqrt(c.var() / np.maximum(c.n, 1.0) + p.var() / np.maximum(p.n, 1.0))
            decision: Decision = "ok" if bool(look.ni_within[name]) else "undecided"
            out.append(
                Comparison(
                    name, decision, _margin(settings, field), int(c.n), int(p.n),
                    _num(est), None, _num(est + z_a * se),
                    "log_ratio" if field == "latency_delta" else "share",
                )
            )  # fmt: skip
    return tuple(out)


def _num(x: F | float) -> float | None:
    v = float(np.asarray(x))
    return v if math.isfinite(v) else None


def _comparison(
    name: str,
    harm: B,
    margin: float,
    n_c: F,
    n_p: F,
    est: F,
    lower: F | None,
    upper: F | None,
    floor: int,
    scale: Scale,
) -> Comparison:
    """A deterioration test as a Comparison: "harm", "ok" (no harm shown at this look) or
    "insufficient" (an arm below `floor` sessions)."""
    enough = min(float(np.asarray(n_c)), float(np.asarray(n_p))) >= floor
    decision: Decision = "harm" if bool(harm) else ("ok" if enough else "insufficient")
    return Comparison(
        name,
        decision,
        margin,
        int(np.asarray(n_c)),
        int(np.asarray(n_p)),
        _num(est),
        None if lower is None else _num(lower),
        None if upper is None else _num(upper),
        scale,
    )


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step of a planned ramp: its weight, the sessions its dwell needs and why, and the
    seconds it is expected to take at the session rate."""

    weight_pct: float
    sessions: float
    seconds: float
    sized_by: str


def plan_rollout(
    steps: Sequence[float],
    *,
    sessions_per_s: float,
    noise: float,
    failing_share: float,
    min_step_s: float,
    settings: VerdictSettings,
    turn_span_s: float = 0.0,
) -> tuple[StepPlan, ...]:
    """Each step's expected dwell at a session rate, a per-session sd of the mean log TTFT
    `noise` (used for every latency summary: first-turn noise is the largest, so this is an
    upper bound) and a production failing-session share. The non-inferiority look waits also
    for the sessions' later turns: `turn_span_s` (first to last turn) is added there."""
    alpha = harm_alpha(settings, steps)
    out = []
    largest = max((s for s in steps if s < 100.0), default=None)
    for pct in steps:
        need, why = 0.0, "min_step_s"
        if pct < 100.0:
            w = pct / 100.0
            cands = []
            if pct >= settings.ramp_ttft_from:
                n = float(
                    mean_sessions(
                        w, noise, math.log(settings.ramp_ttft_harm), alpha, settings.ramp_power
                    )
                )
                n = max(n, settings.min_metric_pairs / min(w, 1.0 - w))
                cands.append((n, "TTFT harm"))
            if pct >= settings.ramp_failure_from:
                n = float(
                    failing_sessions(
                        w, failing_share, settings.ramp_failure_harm, alpha, settings.ramp_power
                    )
                )
                cands.append((n, "failure harm"))
            if pct == largest:
                z = float(
                    special.ndtri(1.0 - settings.alpha) + special.ndtri(settings.ramp_ni_power)
                )
                info = w * (1.0 - w)
                lat = z**2 * noise**2 / (math.log(settings.latency_delta) ** 2 * info)
                fail = z**2 * failing_share * (1 - failing_share) / (settings.error_delta**2 * info)
                cands.append((max(lat, fail), "non-inferiority"))
            if cands:
                need, why = max(cands)
        seconds = max(min_step_s, need / sessions_per_s)
        if pct == largest and why == "non-inferiority":
            seconds += turn_span_s
        out.append(StepPlan(pct, need, seconds, why))
    return tuple(out)
