"""`bench/mirror_rate.paired_ratio`, the interval RESULTS.md quotes for the mirror per copy
against the naive mirror, checked on rounds drawn apart from it: two cells a round whose CPU per
copy share the round's host drift (a slow trend, a noisy neighbour's burst) and each have noise
of their own, heavy-tailed (log-t, 4 degrees of freedom) or log-normal. Over many simulated runs
the 95 % interval holds the true ratio about 95 % of the time, also at 5 rounds (where a normal
quantile instead of Student's t would cover ~88 %), and 20 rounds tell a 7 % cut from parity."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from mirror_rate import paired_ratio  # a benchmark script, found through sys.path


def _run(rng: np.random.Generator, ratio: float, rounds: int, tails: str) -> tuple[list, list]:
    """One benchmark run: per round the naive cell and the tree's cell, in µs per copy."""
    trend = np.linspace(0.0, rng.normal(0.0, 0.2), rounds)  # the host drifts over the run
    burst = rng.random(rounds) < 0.15  # a neighbour takes CPU in some rounds ...
    drift = np.exp(trend + burst * rng.exponential(0.3, rounds))  # ... both cells pay it
    if tails == "t":
        own = 0.04 * rng.standard_t(4, size=(2, rounds))
    else:
        own = rng.normal(0.0, 0.04, size=(2, rounds))
    naive = 240.0 * drift * np.exp(own[0])
    tree = 240.0 * ratio * drift * np.exp(own[1])
    return list(tree), list(naive)


@pytest.mark.parametrize(("rounds", "tails"), [(5, "normal"), (20, "normal"), (20, "t")])
def test_the_interval_holds_the_true_ratio_95_percent_of_the_time(rounds: int, tails: str) -> None:
    rng = np.random.default_rng(20261206 + rounds)
    runs, held = 4000, 0
    for _ in range(runs):
        tree, naive = _run(rng, 0.97, rounds, tails)
        r = paired_ratio(tree, naive)
        assert r is not None
        mean, lo, hi = r
        assert lo < mean < hi
        held += lo <= 0.97 <= hi
    assert 0.93 <= held / runs <= 0.97, held / runs


def test_twenty_rounds_tell_a_seven_percent_cut_from_parity_and_fewer_than_three_say_so() -> None:
    rng = np.random.default_rng(7)
    told = sum(paired_ratio(*_run(rng, 0.93, 20, "t"))[2] < 1.0 for _ in range(500))  # type: ignore[index]
    assert told / 500 > 0.9
    parity = [paired_ratio(*_run(rng, 1.0, 20, "t")) for _ in range(500)]
    assert sum(r[2] < 1.0 or r[1] > 1.0 for r in parity if r) / 500 < 0.08  # ~5 % false calls
    assert paired_ratio([230.0, 240.0], [231.0, 239.0]) is None
    assert math.isclose(paired_ratio([2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0])[0], 2.0)  # type: ignore[index]
