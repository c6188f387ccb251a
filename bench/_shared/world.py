"""An independent world of agent sessions, for validating the verdict (not for the product).

Written apart from `evaluators.pairs.synthetic` on purpose: nothing here is shaped like what
the sequences assume. Sessions of several turns arrive over time; each turn waits for the
previous answer and a think time. What makes it hard:

* session effects — a per-session shift of the candidate's latency relative to the reference
  (sticky replica, long context), on TTFT and TPOT separately;
* clustered failures — a "bad" session fails from some turn to its end, per arm;
* heavy tails — per-arm latency noise is Student-t (3 degrees of freedom), not lognormal;
* nondeterministic engines — at temperature 0 any arm's answer differs from the canonical one
  with a probability that is itself higher in some sessions (answers diverge together);
* live-load differences — production answers at its live load (a latency factor), while the
  mirrored candidate and control share the lighter mirrored load.

`draw(world, sessions, rng)` returns `Pair` Structs in arrival order, to be fed to the
product's own `pairset_from_pairs` -> `build_report` path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import ArmObs, Pair
from evaluators.report.build import build_report

# The candidate's timeout in the simulated deployment: a copy is settled this long after it
# was received (answered or timed out), so a look waits that long for it.
TIMEOUT_S = 60.0

_VOCAB = np.array(
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
)


@dataclass(frozen=True)
class Engine:
    """How one arm behaves (multiplicative on the shared per-turn base)."""

    ttft: float = 1.0  # every turn
    ttft_turn1: float = 1.0  # extra factor on turn 1
    ttft_later: float = 1.0  # extra factor on turns >= 2
    tpot: float = 1.0
    noise: float = 0.07  # scale of the Student-t(3) log-noise (sd ≈ 0.12)
    session_sd_ttft: float = 0.0  # per-session log-shift of this arm's TTFT
    session_sd_tpot: float = 0.0
    fail: float = 0.0005  # background failure rate per turn
    bad_sessions: float = 0.0  # share of sessions failing from a random turn on
    extra_fail: float = 0.0  # an extra per-turn failure rate, delivered whole-session
    nondeterminism: float = 0.0  # P(answer differs from canonical) at T=0
    price: float = 2.0


@dataclass(frozen=True)
class World:
    """Production, candidate and (optionally) the control, and the traffic shape."""

    candidate: Engine = field(default_factory=Engine)
    control: Engine | None = field(default_factory=Engine)
    production: Engine = field(default_factory=Engine)
    live_load: float = 1.0  # production's latency factor at its live load
    turns: tuple[int, int] = (3, 9)  # turns per session, uniform inclusive
    think_s: float = 4.0  # mean think time between turns
    sessions_per_s: float = 0.5
    sessions: bool = True  # sampling by session (else each request stands alone)


def _t3(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_t(3, n)


def _arm(
    eng: Engine,
    rng: np.random.Generator,
    turn: np.ndarray,
    sess: np.ndarray,
    n_sess: int,
    base_ttft: np.ndarray,
    base_tpot: np.ndarray,
    n_turns: np.ndarray,
    load: float,
    canon: np.ndarray,
    sess_div: np.ndarray,
) -> list[ArmObs]:
    n = len(turn)
    shift_ttft = rng.normal(0.0, eng.session_sd_ttft, n_sess)[sess] if eng.session_sd_ttft else 0.0
    shift_tpot = rng.normal(0.0, eng.session_sd_tpot, n_sess)[sess] if eng.session_sd_tpot else 0.0
    turn_f = np.where(turn == 0, eng.ttft_turn1, eng.ttft_later)
    ttft = base_ttft * load * eng.ttft * turn_f * np.exp(eng.noise * _t3(rng, n) + shift_ttft)
    tpot = base_tpot * load * eng.tpot * np.exp(eng.noise * _t3(rng, n) + shift_tpot)
    tokens = np.maximum(2, rng.poisson(80, n))
    e2e = ttft + tpot * (tokens - 1)
    failed = rng.random(n) < eng.fail
    p_bad = eng.bad_sessions + (eng.extra_fail / 0.6 if eng.extra_fail else 0.0)
    if p_bad:
        # A bad session fails from a uniformly chosen turn to its end: on average 60 % of its
        # turns (with 3..9 turns), so extra_fail / 0.6 of sessions carry the extra rate.
        bad = rng.random(n_sess) < p_bad
        start = np.floor(rng.random(n_sess) * n_turns * 0.8).astype(int)
        failed |= bad[sess] & (turn >= start[sess])
    div = rng.random(n) < np.clip(eng.nondeterminism * sess_div[sess], 0.0, 1.0)
    out = []
    for i in range(n):
        if failed[i]:
            out.append(ArmObs(status=503, error_kind="http_status", e2e_s=float(e2e[i])))
            continue
        text = str(canon[i]) if not div[i] else f"{canon[i]} {rng.integers(1 << 30)}"
        out.append(
            ArmObs(
                status=200,
                ttft_s=float(ttft[i]),
                tpot_s=float(tpot[i]),
                e2e_s=float(e2e[i]),
                output_tokens=int(tokens[i]),
                token_counter="tokenize:world",
                prompt_tokens=int(200 + 150 * turn[i]),
                finish_reason="stop",
                output_text=text,
            )
        )
    return out


def draw(world: World, sessions: int, rng: np.random.Generator) -> list[Pair]:
    """`sessions` sessions of pairs, in arrival order."""
    lo, hi = world.turns
    n_turns = rng.integers(lo, hi + 1, sessions)
    start = np.cumsum(rng.exponential(1.0 / world.sessions_per_s, sessions))
    sess = np.repeat(np.arange(sessions), n_turns)
    first = np.concatenate([[0], np.cumsum(n_turns)[:-1]])
    turn = np.arange(len(sess)) - first[sess]
    n = len(sess)
    gaps = rng.exponential(world.think_s, n) + 2.0
    gaps[turn == 0] = 0.0
    at = start[sess] + _cumsum_by(gaps, sess)
    # Later turns carry a longer prompt: a higher base TTFT that KV reuse would cut.
    base_ttft = 0.15 * (1 + 0.4 * turn) * np.exp(rng.normal(0.0, 0.5, n))
    base_tpot = 0.02 * np.exp(rng.normal(0.0, 0.2, n))
    canon = np.array([" ".join(rng.choice(_VOCAB, 6)) for _ in range(n)])
    # Some conversations are fragile: their answers diverge far more often.
    sess_div = np.where(rng.random(sessions) < 0.2, 3.0, 0.5)
    common = (turn, sess, sessions, base_ttft, base_tpot, n_turns, canon, sess_div)
    t, s, ns, bt, bp, nt, cn, sd = common
    prod = _arm(world.production, rng, t, s, ns, bt, bp, nt, world.live_load, cn, sd)
    cand = _arm(world.candidate, rng, t, s, ns, bt, bp, nt, 1.0, cn, sd)
    ctrl = (
        _arm(world.control, rng, t, s, ns, bt, bp, nt, 1.0, cn, sd)
        if world.control is not None
        else None
    )
    order = np.argsort(at, kind="stable")
    out = []
    for i in order:
        key = f"s{sess[i]}" if world.sessions else None
        out.append(
            Pair(
                exchange_id=f"x{i:06d}{int(rng.integers(256)):02x}",
                received_at=float(at[i]),
                production=prod[i],
                candidate=cand[i],
                control=None if ctrl is None else ctrl[i],
                session_key=key,
                turn_index=int(turn[i]),
                temperature=0.0,
            )
        )
    return out


def _cumsum_by(x: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Cumulative sum of x within each (contiguous) group."""
    c = np.cumsum(x)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    offset = np.repeat(c[starts] - x[starts], np.diff(np.r_[starts, len(x)]))
    return c - offset


@dataclass(frozen=True)
class Outcome:
    """One simulated experiment: its first non-hold decision and when it came."""

    decision: str  # "promote" | "reject" | "hold" (at the horizon)
    pairs: int  # pairs in the window at that look (the horizon when held)
    statuses: dict[str, str]  # each gating metric's status at the deciding look
    sessions: int = 0  # sessions with a pair in the window at that look
    units: int = 0  # closed units (sessions) the gating metrics used at that look, at most


def run(
    world: World,
    *,
    kind: str,
    sessions: int,
    looks: int,
    seed: int,
    settings: VerdictSettings | None = None,
    look_every: int | None = None,
    overrides: dict[str, float] | None = None,
    planned_last: bool = True,
) -> Outcome:
    """Draw one experiment and look `looks` times, evenly in pairs (or every `look_every`
    pairs), the last a planned look unless `planned_last` is False.

    Each look is the product's path: a PairSet of the pairs received so far, `build_report`
    with `as_of` = the time of the look (so open sessions and unsettled copies wait). The
    candidate carries `overrides` as its `verdict` overrides, as registered.
    """
    rng = np.random.default_rng(seed)
    pairs = draw(world, sessions, rng)
    full = pairset_from_pairs(pairs, has_control=world.control is not None)
    cand = Endpoint(
        name="cand",
        url="http://c",
        kind=kind,
        sampling="session" if world.sessions else "request",
        timeout_s=TIMEOUT_S,
        price_per_hour_usd=world.candidate.price,
        verdict=dict(overrides or {}),
    )
    live = Endpoint(
        name="live", url="http://l", role="live", price_per_hour_usd=world.production.price
    )
    control = Endpoint(name="ctrl", url="http://k", kind="control") if world.control else None
    s = settings or VerdictSettings()
    n = len(pairs)
    if look_every:
        marks = np.unique(np.r_[np.arange(look_every, n, look_every), n]).astype(int)
    else:
        marks = np.unique(np.linspace(n / looks, n, looks).round().astype(int))
    report = None
    for k in marks:
        final = bool(k == n) and planned_last
        ps = full.resized(int(k))
        report = build_report(
            ps,
            candidate=cand,
            live=live,
            control=control,
            accounting={},
            settings=s,
            planned_look=final,
            as_of=float(ps.received_at[k - 1]),
            trajectories=False,
        )
        if report.verdict != "hold":
            break
    assert report is not None
    gating = {m.name: m.status for m in report.metrics.values() if m.gating}
    seen = len({p.session_key for p in pairs[: int(k)]}) if world.sessions else int(k)
    used = max((m.units or 0 for m in report.metrics.values() if m.gating), default=0)
    return Outcome(report.verdict, int(k), gating, seen, used)


@dataclass(frozen=True)
class Case:
    """A row of the validation table: a world, a kind, a size, and what must (not) happen."""

    label: str
    world: World
    kind: str
    sessions: int
    # The bad outcomes and the largest rate each may have ("promote", "reject", or a metric
    # status "errors=critical"), and the good one with its smallest rate ("promote", or
    # "ttft_later_turns=improved").
    at_most: dict[str, float] = field(default_factory=dict)
    at_least: dict[str, float] = field(default_factory=dict)


def happened(outcome: Outcome, what: str) -> bool:
    """Whether `what` ("promote", "reject", "metric=status") describes the outcome."""
    if "=" in what:
        metric, status = what.split("=")
        return outcome.statuses.get(metric) == status
    return outcome.decision == what


_CLEAN = Engine(fail=0.0005, nondeterminism=0.01)
_S = VerdictSettings()

CASES: tuple[Case, ...] = (
    Case(
        "failures at the critical margin, clustered by session",
        World(candidate=Engine(extra_fail=_S.error_critical), production=_CLEAN, control=_CLEAN),
        "bi-kv",
        333,
        at_most={"promote": 0.05, "errors=critical": 0.05},
    ),
    Case(
        "A/A, failures clustered by session (5 % of sessions per arm)",
        World(
            candidate=Engine(bad_sessions=0.05),
            control=Engine(bad_sessions=0.05),
            production=Engine(bad_sessions=0.05),
        ),
        "bi-kv",
        800,
        at_most={"promote": 0.05, "reject": 0.05, "ttft_later_turns=improved": 0.05},
    ),
    Case(
        "A/A quantized at equal price, session effect sd 0.1 on TPOT",
        World(candidate=Engine(session_sd_tpot=0.1)),
        "quantized",
        800,
        at_most={"promote": 0.05, "reject": 0.05, "cost=improved": 0.05},
    ),
    Case(
        "A/A, no control, engines 15 % nondeterministic at T=0",
        World(
            candidate=Engine(nondeterminism=0.15),
            production=Engine(nondeterminism=0.15),
            control=None,
        ),
        "bi-kv",
        800,
        at_most={"promote": 0.05, "reject": 0.05},
    ),
    Case(
        "same config as live, no control, live 15 % slower under its own load, bi-kv",
        World(control=None, live_load=1.15),
        "bi-kv",
        800,
        at_most={"promote": 0.05, "reject": 0.05},
    ),
    Case(
        "bi-kv: turn-1 TTFT x1.3 (past the 1.25 critical margin), later turns x0.8",
        World(candidate=Engine(ttft_turn1=1.3, ttft_later=0.8)),
        "bi-kv",
        333,
        at_most={"promote": 0.05},
    ),
    Case(
        # `canary plan --turns 6` (defaults, 0.1 % one-arm failures, 2 % disagreement): 788.
        "20 % faster later turns, default margins, horizon 800 sessions (canary plan: 788)",
        World(
            candidate=Engine(ttft_later=0.8, fail=0.0005, nondeterminism=0.01),
            production=_CLEAN,
            control=_CLEAN,
        ),
        "bi-kv",
        800,
        at_least={"promote": 0.95},
    ),
    Case(
        "3 % faster TTFT at 10 % per-arm noise, goal shown by 300 pairs (per request)",
        World(
            candidate=Engine(ttft=0.97, noise=0.058),
            production=Engine(noise=0.058),
            control=Engine(noise=0.058),
            sessions=False,
            turns=(6, 6),
        ),
        "bi-kv",
        50,
        at_least={"ttft_later_turns=improved": 0.90},
    ),
)

# The mutation sentinel: long sessions that run mostly one after another, each failing whole on
# one arm in 10 % of sessions. With sessions as units it is an easy A/A; bet on pairs, and a
# single bad session is twenty failures in a row, which "shows" decisive harm.
SENTINEL = Case(
    "A/A, 10 % of long sessions fail on an arm, sessions in sequence (mutation sentinel)",
    World(
        candidate=Engine(fail=0.0, bad_sessions=0.1),
        control=Engine(fail=0.0, bad_sessions=0.1),
        production=Engine(fail=0.0, bad_sessions=0.1),
        turns=(15, 25),
        sessions_per_s=0.02,
    ),
    "bi-kv",
    100,
    at_most={"reject": 0.05},
)


# --- Issue 19: deciding as fast as the evidence allows, within the plan's sessions ---------

# Real engines sharing CPUs: per-arm log SD ~0.8 with heavy tails (Student-t(3) of scale 0.46:
# sd 0.46·√3 = 0.80), so a pair's TTFT log-ratio has sd ~1.1; three-turn sessions.
REAL_NOISE = 0.46
# Margins for ~200 sessions at that noise, as `canary plan --noise 1.1 --turns 3 --horizon 200`
# gives them (the real-engine suite's, tests/real_engine/conftest.py): rates 3 pp, latency 1.4.
REAL_MARGINS: dict[str, float] = {
    "error_delta": 0.03,
    "error_critical": 0.1,
    "agreement_delta": 0.03,
    "slo_exceedance_delta": 0.03,
    "similarity_delta": 0.03,
    "latency_delta": 1.4,
    "latency_critical": 1.75,
}
# The README's margins for 200-400 sessions at simulator-like noise.
SMALL_MARGINS: dict[str, float] = {
    "error_delta": 0.03,
    "error_critical": 0.1,
    "agreement_delta": 0.03,
    "slo_exceedance_delta": 0.03,
    "similarity_delta": 0.03,
    "latency_delta": 1.10,
}


def _real(**kw: float) -> Engine:
    base: dict[str, float] = {"noise": REAL_NOISE, "fail": 0.0005, "nondeterminism": 0.01}
    return Engine(**{**base, **kw})


_REAL_AA = World(candidate=_real(), control=_real(), production=_real(), turns=(3, 3))


@dataclass(frozen=True)
class PlannedCase:
    """A world judged for as many sessions as `canary plan` says, from a pilot's noise."""

    label: str
    world: World
    kind: str
    overrides: dict[str, float]
    expect: str  # "promote" | "reject" | "aa" (neither false promote nor false reject)
    goal_ratio: float | None = None  # the operator's expected goal (`--goal-ratio`)
    # The world the operator's pilot saw, when not this one: a harmful candidate is planned
    # for as the clean candidate it was expected to be.
    pilot: World | None = None


PLANNED: tuple[PlannedCase, ...] = (
    PlannedCase(
        "bi-kv, later turns 20 % faster, simulator-like noise (3-9 turns)",
        World(
            candidate=Engine(ttft_later=0.8, nondeterminism=0.01), production=_CLEAN, control=_CLEAN
        ),
        "bi-kv",
        SMALL_MARGINS,
        "promote",
        0.8,
    ),
    PlannedCase(
        "bi-kv, later turns 40 % faster, real-engine noise (3 turns)",
        World(candidate=_real(ttft_later=0.6), control=_real(), production=_real(), turns=(3, 3)),
        "bi-kv",
        REAL_MARGINS,
        "promote",
        0.6,
    ),
    PlannedCase(
        "bi-kv, later turns 20 % faster, real-engine noise (3 turns)",
        World(candidate=_real(ttft_later=0.8), control=_real(), production=_real(), turns=(3, 3)),
        "bi-kv",
        REAL_MARGINS,
        "promote",
        0.8,
    ),
    PlannedCase(
        "+5 pp failures clustered by session, real-engine noise",
        World(candidate=_real(extra_fail=0.05), control=_real(), production=_real(), turns=(3, 3)),
        "bi-kv",
        # The default failure margins (1 pp, 3 pp critical): +5 pp is decisive harm.
        {**REAL_MARGINS, "error_delta": 0.01, "error_critical": 0.03},
        "reject",
        0.8,
        pilot=_REAL_AA,
    ),
    PlannedCase(
        "bf16-like divergence (40 % of answers differ at T=0), real-engine noise",
        World(
            candidate=_real(nondeterminism=0.4),
            control=_real(),
            production=_real(),
            turns=(3, 3),
        ),
        "quantized",
        REAL_MARGINS,
        "reject",
        pilot=_REAL_AA,
    ),
    PlannedCase(
        "A/A bi-kv, real-engine noise (3 turns)",
        World(candidate=_real(), control=_real(), production=_real(), turns=(3, 3)),
        "bi-kv",
        REAL_MARGINS,
        "aa",
        0.8,
    ),
    PlannedCase(
        "A/A bi-kv, simulator-like noise (3-9 turns)",
        World(candidate=_CLEAN, control=_CLEAN, production=_CLEAN),
        "bi-kv",
        SMALL_MARGINS,
        "aa",
        0.8,
    ),
)


def plan_sessions(case: PlannedCase, *, pilot: int = 100, seed: int = 999) -> tuple[int, int]:
    """(sessions `canary plan --candidate` states, its horizon) from a pilot of `pilot`
    sessions of the case's world: the operator's path, through the product's plan core."""
    from evaluators.judge import plan as core

    rng = np.random.default_rng(seed)
    pairs = draw(case.pilot or case.world, pilot, rng)
    ps = pairset_from_pairs(pairs, has_control=case.world.control is not None)
    cand = Endpoint(
        name="cand",
        url="http://c",
        kind=case.kind,
        sampling="session",
        timeout_s=TIMEOUT_S,
        verdict=dict(case.overrides),
    )
    live = Endpoint(name="live", url="http://l", role="live")
    control = Endpoint(name="ctrl", url="http://k", kind="control")
    s = VerdictSettings().with_overrides(case.overrides)
    report = build_report(
        ps,
        candidate=cand,
        live=live,
        control=control,
        accounting={},
        settings=s,
        trajectories=False,
    )
    turns = len(pairs) / pilot
    rows = core.measured_rows(list(report.metrics.values()), s, goal_ratio=case.goal_ratio)
    rows.append(core.FixedRow("minimum pairs gate", "", int(np.ceil(s.min_pairs / turns))))
    traffic = core.Traffic(rate_rps=1.0, sample_rate=1.0, turns=turns)
    needs, horizon = core.needs(traffic, s, rows=rows)
    known = [n.units for n in needs if n.units is not None]
    return max([*known, horizon]), horizon


def run_planned(
    case: PlannedCase, sessions: int, horizon: int, *, seed: int, look_every: int = 20
) -> Outcome:
    """One experiment of the case for `sessions` sessions, tuned to `horizon`, looks every 20
    pairs, the last one planned (where a guardrail beyond its margin rejects)."""
    return run(
        case.world,
        kind=case.kind,
        sessions=sessions,
        looks=0,
        seed=seed,
        look_every=look_every,
        overrides={**case.overrides, "horizon_units": horizon},
    )


def right(case: PlannedCase, o: Outcome) -> bool:
    """Whether the outcome is the decision the case deserves (A/A: no false decision)."""
    if case.expect == "aa":
        return o.decision == "hold"
    return o.decision == case.expect
