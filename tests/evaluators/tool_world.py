"""An independent world of agent sessions whose answers make invalid tool calls, for validating
the tool-call validity verdict (not for the product).

Written apart from the product's synthetic pairs and from `evaluators.metrics.toolcalls`:
nothing here is shaped like what the betting sequence assumes. What makes it hard:

* sessions of 2-12 turns (a long tail), most turns a call, the last one text; an answer of
  either kind can break its request's contract (a call where "none" was asked, text where a
  call was required), so the rates given are per answer;
* clustered failures: a session draws a difficulty (gamma, shape 0.5: most sessions easy, a few
  very hard: an awkward schema, a long context) that multiplies both arms' invalid chance on
  every call turn of it, so invalid calls come in bursts within sessions;
* arm-specific bursts: each arm also has its own per-session jitter (nondeterminism: one arm
  slips where the other does not);
* answers that say nothing about validity: failed answers (clustered in a few sessions) and
  answers whose schema could not be checked safely (`uncheckable`), on either arm;
* the reasons mix as in real traffic (schema errors most, then non-object arguments, undeclared
  functions, a missing call, a parallel call, a call id).

`draw(world, sessions, rng)` fills a `PairSet` (the evaluators' input) column by column, the
product's documented input; `judge_at(ps, k)` looks at its first k pairs through the product's
metric and verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from domain.endpoint import Endpoint
from domain.outcomes import TOOL_CHECKS, ToolCheck
from evaluators.judge.metric import EvalContext, MetricResult
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import judge
from evaluators.metrics.toolcalls import tool_validity
from evaluators.pairs.types import PairSet

# The invalid reasons as real traffic mixes them (weights), by name: the world's own table.
_REASONS = (
    ("schema", 0.55),
    ("arguments_not_object", 0.2),
    ("undeclared", 0.1),
    ("missing_call", 0.07),
    ("parallel", 0.05),
    ("call_id", 0.03),
)
_CODE = {str(c): i for i, c in enumerate(TOOL_CHECKS)}


@dataclass(frozen=True)
class World:
    """Invalid-call rates per call turn (before the session's difficulty) of each arm."""

    production: float = 0.01
    candidate: float = 0.01
    failed: float = 0.01  # share of answers that failed (either arm), clustered
    uncheckable: float = 0.005
    difficulty_shape: float = 0.5  # gamma shape of the per-session multiplier (mean 1)
    jitter_sd: float = 0.5  # sd of each arm's own per-session log-multiplier


def _turns(rng: np.random.Generator, sessions: int) -> np.ndarray:
    """2-12 turns, most sessions short, a long tail."""
    return np.minimum(2 + rng.geometric(0.3, sessions) - 1, 12)


def _arm_codes(
    rng: np.random.Generator,
    rate: float,
    mult: np.ndarray,
    world: World,
) -> np.ndarray:
    n = len(mult)
    p = np.clip(rate * mult, 0.0, 0.9)
    invalid = rng.random(n) < p
    names = [r for r, _ in _REASONS]
    weights = np.array([w for _, w in _REASONS])
    reasons = rng.choice(len(names), size=n, p=weights / weights.sum())
    codes = np.full(n, _CODE[str(ToolCheck.VALID)], dtype=np.int8)
    for i, name in enumerate(names):
        codes[invalid & (reasons == i)] = _CODE[name]
    codes[rng.random(n) < world.uncheckable] = _CODE[str(ToolCheck.UNCHECKABLE)]
    return codes


def draw(world: World, sessions: int, rng: np.random.Generator) -> PairSet:
    """`sessions` sessions, one after the other, as a PairSet in arrival order."""
    turns = _turns(rng, sessions)
    n = int(turns.sum())
    sid = np.repeat(np.arange(1, sessions + 1, dtype=np.uint64), turns)
    start = np.repeat(np.cumsum(turns) - turns, turns)
    turn = np.arange(n) - start
    difficulty = rng.gamma(world.difficulty_shape, 1.0 / world.difficulty_shape, sessions)
    shared = np.repeat(difficulty, turns)

    def jitter() -> np.ndarray:
        s = world.jitter_sd
        return np.repeat(np.exp(rng.normal(-s * s / 2, s, sessions)), turns)

    ps = PairSet.empty(n)
    ps.n = n
    ps.received_at[:] = np.arange(n, dtype=np.float64)
    ps.session[:] = sid
    ps.turn[:] = turn
    ps.tools_requested[:] = True
    ps.temperature[:] = 0.7
    bad_session = np.repeat(rng.random(sessions) < world.failed * 3, turns)
    for arm, rate in (("production", world.production), ("candidate", world.candidate)):
        cols = ps.arm(arm)
        failed = bad_session & (rng.random(n) < 1 / 3)
        cols.present[:] = True
        cols.status[:] = np.where(failed, 503, 200)
        cols.ok[:] = ~failed
        cols.tool_check[:] = _arm_codes(rng, rate, shared * jitter(), world)
        cols.tool_check[failed] = -1  # a failed answer is never checked
    return ps


CAND = Endpoint(name="cand", url="http://c", kind="quantized", sampling="session")


def judge_at(ps: PairSet, k: int, settings: VerdictSettings, *, planned: bool) -> MetricResult:
    """The tool-validity metric on the first `k` pairs, judged by the product's verdict rule."""
    head = ps.head(k)
    ctx = EvalContext(
        pairs=head, settings=settings, candidate=CAND, planned_look=planned, trajectories=False
    )
    results = tool_validity(ctx)
    judge(results, n_pairs=k, coverage=None, planned=planned, settings=settings)
    return results[0]


def session_ends(ps: PairSet) -> np.ndarray:
    """Pair counts at which a session has just ended (looks never cut a session)."""
    s = ps.session[: ps.n]
    return np.flatnonzero(np.r_[s[1:] != s[:-1], True]) + 1
