"""Units of independence: sessions as units, only closed and settled ones, in a fixed order."""

from __future__ import annotations

import itertools

import numpy as np

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import ArmObs, Pair
from evaluators.report.build import build_report
from evaluators.stats.units import build_units

ALL = np.ones(6, dtype=bool)


def test_a_session_is_one_unit_and_waits_until_idle() -> None:
    """Turns of one session form one unit, which is used only once the session has idled."""
    t = np.array([0.0, 5.0, 10.0, 1.0, 2.0, 3.0])
    s = np.array([7, 7, 7, 9, 9, 9], dtype=np.uint64)
    early = build_units(t, s, by_session=True, as_of=20.0, idle_s=15.0, settled=ALL)
    assert early.count == 1 and early.open_pairs == 3  # session 9 closed at 18, 7 not until 25
    late = build_units(t, s, by_session=True, as_of=30.0, idle_s=15.0, settled=ALL)
    assert late.count == 2 and late.open_pairs == 0
    means, sizes, used = late.means(np.arange(6.0), np.ones(6, dtype=bool))
    assert list(means) == [4.0, 1.0] and list(sizes) == [3, 3] and used == 6


def test_a_long_pause_splits_a_session_into_two_units() -> None:
    """A gap longer than the idle gap starts a new unit of the same session."""
    t = np.array([0.0, 1.0, 100.0, 101.0])
    s = np.full(4, 5, dtype=np.uint64)
    u = build_units(t, s, by_session=True, as_of=1e9, idle_s=30.0, settled=np.ones(4, bool))
    assert u.count == 2 and list(u.rank) == [0, 0, 1, 1]


def test_a_pending_copy_stops_the_look_there() -> None:
    """A look uses the units before the first one still waiting for a copy, none after it:
    answered pairs that arrived later do not jump the queue (no bias toward fast copies)."""
    t = np.arange(6, dtype=np.float64)
    none = np.zeros(6, dtype=np.uint64)
    settled = np.array([True, True, False, True, True, True])
    u = build_units(t, none, by_session=False, as_of=10.0, idle_s=30.0, settled=settled)
    assert u.count == 2 and list(u.rank) == [0, 1, -1, -1, -1, -1]


def test_an_earlier_look_is_a_prefix_of_a_later_one() -> None:
    """The units of an earlier look come first, in the same order, at every later look."""
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 1000, 400))
    s = rng.integers(1, 60, 400).astype(np.uint64)
    ok = np.ones(400, dtype=bool)
    ranks = [
        build_units(t, s, by_session=True, as_of=a, idle_s=30.0, settled=ok).rank
        for a in (300.0, 600.0, 2000.0)
    ]
    for early, late in itertools.pairwise(ranks):
        used = early >= 0
        assert np.array_equal(early[used], late[used])


def _pair(i: int, session: str, at: float, cand_ok: bool = True) -> Pair:
    prod = ArmObs(ttft_s=0.2, tpot_s=0.02, e2e_s=2.0, output_tokens=100, output_hash="h")
    cand = ArmObs(ttft_s=0.2, tpot_s=0.02, e2e_s=2.0, output_tokens=100, output_hash="h")
    if not cand_ok:
        cand = ArmObs(status=500, error_kind="http_status")
    return Pair(
        exchange_id=f"{i:08x}",
        received_at=at,
        production=prod,
        candidate=cand,
        control=prod,
        session_key=session,
        turn_index=i % 10,
        temperature=0.0,
    )


def test_a_failing_session_counts_once_in_the_failure_rate() -> None:
    """Ten turns of one session failing together are one unit of the failure rate (mean 1),
    not ten independent failures: n shows 200 pairs over 20 sessions."""
    pairs = [_pair(i, f"s{i // 10}", float(i), cand_ok=i >= 10) for i in range(200)]
    cand = Endpoint(name="c", url="http://c", kind="bi-kv", sampling="session")
    r = build_report(
        pairset_from_pairs(pairs),
        candidate=cand,
        live=None,
        control=Endpoint(name="k", url="http://k", kind="control"),
        accounting={},
        settings=VerdictSettings(),
    )
    errors = r.metrics["errors"]
    assert errors.n == 200 and errors.units == 20
    assert errors.estimate is not None and abs(errors.estimate - 1 / 20) < 1e-9
