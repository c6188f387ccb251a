"""Simulation tests: the verdict's error rates and power, measured over seeded repeated runs.

Each run draws a stream of pairs (production, candidate, control) with planted effects and
looks at the evidence every 20 pairs, exactly as an operator refreshing the report would; the
run's decision is the first non-hold verdict (an operator acts on it), or hold at the horizon.
Everything the verdict uses comes from the production code: the metric specs of each evaluator,
`evidence` over the confidence sequences of `evaluators.stats.sequential`, and `decide_arrays`.
Only the per-pair values are drawn here directly (vectorized over runs), independent pairs with
no sessions: this checks the sequences and the combination rules in the model they assume.
`test_eval_validation.py` checks the whole report path on an independent world with sessions.

Model: per-request base latencies are shared by the arms (it cancels in the log-ratio); each arm
adds independent lognormal noise (σ = 0.1, "10 % per-arm noise"); at temperature 0 the control
(the noise floor) and an unchanged candidate each differ from production in 2 % of answers;
failures are rare (0.05 % per arm) unless planted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import MetricSpec, evidence, mean_stat
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import HOLD, PROMOTE, REJECT, STATUSES, decide_arrays
from evaluators.metrics.cost import cost_spec
from evaluators.metrics.errors import failure_spec
from evaluators.metrics.latency import latency_spec, later_turns_spec, slo_spec
from evaluators.metrics.quality import agreement_spec, length_spec
from evaluators.stats.sequential import BoundedStat, MeanStat

RUNS = 200
IMPROVED = STATUSES.index("improved")
LOOK_EVERY = 20
SETTINGS = VerdictSettings()
F = NDArray[np.float64]


@dataclass(frozen=True)
class Plant:
    """Planted differences of the candidate (the control always equals production)."""

    ttft_ratio: float = 1.0  # every turn
    later_ttft_ratio: float = 1.0  # turns >= 2 only
    error_rate: float = 0.0005
    divergence: float = 0.02
    noise: float = 0.1
    control_divergence: float = 0.02
    base_error_rate: float = 0.0005
    finish_disagree: float = 0.002
    later_every: int = 2  # every k-th pair is a later turn (1 = all pairs)
    price_ratio: float = 1.0  # candidate $/h / live $/h


@dataclass
class Run:
    """Per-pair values of every gating metric, shape (runs, pairs), in arrival order."""

    values: dict[str, F] = field(default_factory=dict)
    usable: F = field(default_factory=lambda: np.zeros(0))  # both arms answered


def _lognormal_pair(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> F:
    """log(candidate noise) - log(reference noise) for one latency."""
    z: F = sigma * (rng.standard_normal(shape) - rng.standard_normal(shape))
    return z


def simulate(plant: Plant, runs: int, n: int, seed: int) -> Run:
    """Draw the per-pair statistics for `runs` independent streams of n pairs.

    Every `later_every`-th pair is a later turn (so every run has the same count of each).
    """
    rng = np.random.default_rng(seed)
    shape = (runs, n)
    later = np.zeros(n, dtype=bool)
    later[plant.later_every - 1 :: plant.later_every] = True
    turn_ratio = np.where(later, plant.later_ttft_ratio, 1.0)
    base_ttft = 0.2 * rng.lognormal(0.0, 0.5, shape)
    ttft_ref = base_ttft * rng.lognormal(0.0, plant.noise, shape)
    ttft_cand = base_ttft * plant.ttft_ratio * turn_ratio * rng.lognormal(0.0, plant.noise, shape)
    x_ttft = np.log(ttft_cand / ttft_ref)
    x_tpot = _lognormal_pair(rng, shape, plant.noise)
    decode = 2.4 * rng.lognormal(0.0, 0.3, shape)  # seconds of decoding, shared
    e2e_ref = ttft_ref + decode * rng.lognormal(0.0, plant.noise, shape)
    e2e_cand = ttft_cand + decode * np.exp(x_tpot) * rng.lognormal(0.0, plant.noise, shape)
    fail_c = rng.random(shape) < plant.error_rate
    fail_r = rng.random(shape) < plant.base_error_rate
    div_c = rng.random(shape) < plant.divergence
    div_k = rng.random(shape) < plant.control_divergence
    fin_c = rng.random(shape) < plant.finish_disagree
    fin_k = rng.random(shape) < plant.finish_disagree
    f64 = np.float64
    run = Run()
    run.values = {
        "ttft": x_ttft,
        "tpot": x_tpot,
        "e2e": np.log(e2e_cand / e2e_ref),
        "ttft_later_turns": x_ttft[:, later],
        "ttft_slo": (ttft_cand > SETTINGS.slo_ttft_s).astype(f64)
        - (ttft_ref > SETTINGS.slo_ttft_s),
        "e2e_slo": (e2e_cand > SETTINGS.slo_e2e_s).astype(f64) - (e2e_ref > SETTINGS.slo_e2e_s),
        "errors": fail_c.astype(f64) - fail_r,
        "exact_match": div_c.astype(f64) - div_k,
        "finish_reason": fin_c.astype(f64) - fin_k,
        "output_length": 0.05 * (rng.standard_normal(shape) - rng.standard_normal(shape)),
        # evaluators.metrics.cost: log(price ratio) + log(TPOT candidate / TPOT reference)
        "cost": x_tpot + np.log(plant.price_ratio),
    }
    run.usable = np.cumsum(~fail_c & ~fail_r, axis=1).astype(f64)
    return run


def specs(kind: str) -> dict[str, MetricSpec]:
    """The gating metrics' specs, built by the evaluators' own spec functions."""
    s = SETTINGS
    return {
        "ttft": latency_spec(s, "ttft", "TTFT"),
        "tpot": latency_spec(s, "tpot", "TPOT"),
        "e2e": latency_spec(s, "e2e", "E2E"),
        "ttft_later_turns": later_turns_spec(s, kind),
        "ttft_slo": slo_spec(s, "ttft"),
        "e2e_slo": slo_spec(s, "e2e"),
        "errors": failure_spec(s),
        "exact_match": agreement_spec(s, "exact_match", "differs at T=0"),
        "finish_reason": agreement_spec(s, "finish_reason", "finish reason differs"),
        "output_length": length_spec(s),
        "cost": cost_spec(s, kind),
    }


def judge_runs(
    run: Run, kind: str, n: int, later_every: int = 2
) -> tuple[NDArray[np.int8], NDArray[np.int8], list[str]]:
    """(verdict per run and look, status per metric/run/look, metric names)."""
    looks = np.arange(LOOK_EVERY, n + 1, LOOK_EVERY)
    names, roles, ev = [], [], []
    for name, spec in specs(kind).items():
        if spec.role == "diagnostic":
            continue
        x = run.values[name]
        lk = looks // later_every if name == "ttft_later_turns" else looks
        if spec.scale == "ratio":
            stat: MeanStat | BoundedStat = mean_stat(x, lk, SETTINGS)
        else:
            stat = BoundedStat(x, lk)
        names.append(name)
        roles.append(spec.role)
        ev.append(evidence(spec, stat))
    verdict, status = decide_arrays(
        roles,
        ev,
        n_pairs=run.usable[:, looks - 1],
        coverage_ok=True,
        planned=looks == n,
        settings=SETTINGS,
    )
    return verdict, status, names


def decisions(
    plant: Plant, kind: str, n: int, runs: int, seed: int
) -> tuple[NDArray[np.int8], NDArray[np.int8], NDArray[np.int8], list[str]]:
    """(first decision per run, verdicts, statuses, names), simulated in chunks of 200 runs
    so memory stays bounded."""
    verdicts, statuses = [], []
    names: list[str] = []
    for chunk in range(0, runs, 200):
        run = simulate(plant, min(200, runs - chunk), n, seed=seed * 1000 + chunk)
        v, st, names = judge_runs(run, kind, n, plant.later_every)
        verdicts.append(v)
        statuses.append(st)
    verdict = np.concatenate(verdicts)
    return first_decision(verdict), verdict, np.concatenate(statuses, axis=1), names


def first_decision(verdict: NDArray[np.int8]) -> NDArray[np.int8]:
    """Each run's first non-hold verdict over its looks, or hold."""
    decided = verdict != HOLD
    first = np.argmax(decided, axis=1)
    out: NDArray[np.int8] = np.where(
        decided.any(axis=1), verdict[np.arange(len(verdict)), first], HOLD
    ).astype(np.int8)
    return out


def rates(decisions: NDArray[np.int8]) -> dict[str, float]:
    return {
        "promote": float(np.mean(decisions == PROMOTE)),
        "hold": float(np.mean(decisions == HOLD)),
        "reject": float(np.mean(decisions == REJECT)),
    }


def test_aa_false_promote_and_false_reject() -> None:
    """Under A/A (candidate = control = production), looking every 20 pairs up to 2,000 with a
    planned look at 2,000, false promote and false reject are each <= 5 % (1,000 runs per kind:
    a bi-kv candidate whose goal is later-turn TTFT, a quantized one whose goal is cost)."""
    n = 2000
    for i, kind in enumerate(("bi-kv", "quantized")):
        first, _, _, _ = decisions(Plant(), kind, n, runs=1000, seed=1 + i)
        r = rates(first)
        print(f"A/A {kind}: {r}")
        assert r["promote"] <= 0.05
        assert r["reject"] <= 0.05


def test_aa_goal_alone_is_rarely_shown() -> None:
    """Under A/A each goal alone (later-turn TTFT for bi-kv, cost for quantized) is shown at
    some look in <= 5 % of 1,000 runs: the false-promote rate the verdict would have if every
    guardrail had already passed."""
    n = 2000
    for i, (kind, goal) in enumerate((("bi-kv", "ttft_later_turns"), ("quantized", "cost"))):
        _, _, status, names = decisions(Plant(), kind, n, runs=1000, seed=3 + i)
        shown = float(np.mean(np.any(status[names.index(goal)] == IMPROVED, axis=1)))
        print(f"A/A {kind}: goal shown at some look in {shown:.1%} of runs")
        assert shown <= 0.05


# Planted effects: (label, plant, right decision, horizon in pairs). Promotion needs every
# guardrail inside its margin (errors and agreement 1 pp: ~380 clean independent pairs at least,
# more against a 1 % noise floor), hence the long horizon and the healthy base rates of the
# promote case.
PLANTED = [
    (
        "20% faster TTFT",
        Plant(
            ttft_ratio=0.8,
            base_error_rate=0.0,
            error_rate=0.0,
            divergence=0.01,
            control_divergence=0.01,
        ),
        PROMOTE,
        6000,
    ),
    ("30% divergent answers at T=0", Plant(divergence=0.30), REJECT, 2000),
    ("2x slower TTFT", Plant(ttft_ratio=2.0), REJECT, 2000),
    ("+10 pp errors", Plant(error_rate=0.1005), REJECT, 2000),
]


def test_planted_effects_are_decided_right() -> None:
    """Each planted effect gets the right decision in >= 95 % of 200 runs (bi-kv candidate)."""
    for i, (label, plant, expected, n) in enumerate(PLANTED):
        first, verdict, _, _ = decisions(plant, "bi-kv", n, runs=RUNS, seed=20 + i)
        right = float(np.mean(first == expected))
        when = LOOK_EVERY * (np.argmax(verdict == expected, axis=1) + 1)
        print(f"{label}: {rates(first)}; median pairs to decide {np.median(when):.0f}")
        assert right >= 0.95, label


def test_power_three_percent_ttft_within_300_pairs() -> None:
    """A 3 % TTFT improvement at 10 % per-arm noise is shown (bi-kv goal, every pair a later
    turn) at some look within 300 pairs in >= 80 % of 1,000 runs."""
    n = 300
    plant = Plant(later_ttft_ratio=0.97, later_every=1)
    _, _, status, names = decisions(plant, "bi-kv", n, runs=1000, seed=40)
    found = float(np.mean(np.any(status[names.index("ttft_later_turns")] == IMPROVED, axis=1)))
    print(f"3% TTFT shift found within {n} pairs in {found:.1%} of runs")
    assert found >= 0.80
