"""The metrics by turn use only whole sessions: a later turn whose earlier turn never reached the
candidate (its copy unanswered, or no pair of it at all) is left out, and the metric says how
many sessions it left out and why."""

from __future__ import annotations

import math

from domain.endpoint import Endpoint
from evaluators.judge.metric import EvalContext
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import latency
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import ArmObs, Pair

CAND = Endpoint(name="c", url="http://c", kind="bi-kv")
LIVE = Endpoint(name="l", url="http://l", role="live")


def _arm(ttft: float, status: int = 200, error: str | None = None) -> ArmObs:
    return ArmObs(status=status, error_kind=error, ttft_s=ttft, e2e_s=ttft + 0.5)


def _session(s: int, turns: range, cand: dict[int, ArmObs | None]) -> list[Pair]:
    """Turns of session `s` (the candidate's arm per turn; absent: 0.1 s, None: no answer)."""
    return [
        Pair(
            exchange_id=f"{s:04x}{t:02x}",
            received_at=float(10 * s + t),
            production=_arm(0.2 * math.exp(0.03 * math.sin(s + t))),
            candidate=cand.get(t, _arm(0.1 * math.exp(0.03 * math.cos(s * t)))),
            session_key=f"{s + 1:032x}",
            turn_index=t,
        )
        for t in turns
    ]


def _ctx(pairs: list[Pair]) -> EvalContext:
    return EvalContext(
        pairs=pairset_from_pairs(pairs),
        settings=VerdictSettings(),
        candidate=CAND,
        live=LIVE,
        planned_look=True,
    )


def test_later_turns_of_headless_sessions_are_left_out_and_counted() -> None:
    """Of 23 three-turn sessions, one lost its first turn's copy (unanswered), one its second
    (refused: status 0), one has no first turn among the pairs, and one's later turns are slow:
    only the 20 whole ones count in TTFT turns ≥ 2 and the by-turn table, the note names 2
    sessions lost and 1 missing, and the first-turn row keeps every answered first turn."""
    pairs: list[Pair] = []
    for s in range(20):
        pairs += _session(s, range(3), {})
    headless = _arm(5.0)  # a cold cache: what the metric must not see
    pairs += _session(20, range(3), {0: None, 1: headless, 2: headless})
    pairs += _session(21, range(3), {1: _arm(0.0, status=0, error="connect"), 2: headless})
    pairs += _session(22, range(1, 3), {1: headless, 2: headless})
    ctx = _ctx(pairs)
    whole = latency.whole_sessions(ctx.pairs)
    assert (whole.lost, whole.missing, whole.pairs) == (2, 1, 5)
    (res,) = latency.ttft_later_turns(ctx)
    assert res.n == 40
    assert res.estimate is not None and res.estimate < 0.6
    assert res.detail["headless_sessions_lost"] == 2
    assert res.detail["headless_sessions_missing"] == 1
    assert any("5 later-turn pairs of 3 sessions left out" in note for note in res.notes)
    table = latency.ttft_by_turn(ctx)
    assert [row["n"] for row in table] == [21, 20, 20, 0, 0]


def test_whole_sessions_keep_every_pair() -> None:
    """With every turn answered (and pairs without a session), nothing is left out and no note
    is added."""
    pairs = [p for s in range(30) for p in _session(s, range(3), {})]
    pairs.append(Pair(exchange_id="x", received_at=1e3, production=_arm(0.2), turn_index=2))
    ctx = _ctx(pairs)
    whole = latency.whole_sessions(ctx.pairs)
    assert bool(whole.mask[: ctx.pairs.n].all()) and (whole.lost, whole.missing) == (0, 0)
    (res,) = latency.ttft_later_turns(ctx)
    assert res.n == 60 and not any("left out" in note for note in res.notes)
