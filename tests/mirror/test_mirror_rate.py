"""The rate controller's math (`target_rps`), pure: it converges on steady and on bursty
arrivals, never samples above `sample_rate`, starts below the target, changes rarely (more
rarely in session mode), and keeps samples nested across targets.

The arrivals come from this file's own generator (Poisson, and a two-state Markov-modulated
Poisson process for bursts), not from the gateway's code; each arrival is a random request id
decided by the real sampling formula, so "realized" is what the gateway would have copied."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gateway.mirror.sampling import rate
from gateway.mirror.sampling.rate import EligibleRates, RateControl, Reference, effective_rate
from gateway.mirror.sampling.sampler import SALT, is_sampled, threshold_for

WORKERS = 2


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw by counting exponential gaps inside one second (independent of numpy)."""
    n, t = 0, rng.expovariate(lam) if lam > 0 else math.inf
    while t < 1.0:
        n += 1
        t += rng.expovariate(lam)
    return n


def steady(rng: random.Random, lam: float, seconds: int) -> Iterator[int]:
    for _ in range(seconds):
        yield poisson(rng, lam)


def bursty(
    rng: random.Random, low: float, high: float, mean_hold_s: float, seconds: int
) -> Iterator[int]:
    """Two-state MMPP: the rate switches between `low` and `high` after exponential holds."""
    lam, left = low, rng.expovariate(1 / mean_hold_s)
    for _ in range(seconds):
        if left <= 0:
            lam = high if lam == low else low
            left = rng.expovariate(1 / mean_hold_s)
        left -= 1
        yield poisson(rng, lam)


@dataclass
class Run:
    """Per second: offered requests, copies sampled and the share in force, per candidate."""

    offered: list[int] = field(default_factory=list)
    copies: dict[str, list[int]] = field(default_factory=dict)
    share: dict[str, list[float]] = field(default_factory=dict)
    changes: int = 0

    def mean_copies(self, name: str, start: int) -> float:
        return statistics.fmean(self.copies[name][start:])


def simulate(
    arrivals: Iterator[int],
    candidates: dict[str, tuple[float, float]],
    *,
    mode: rate.Mode = "request",
    seed: int = 7,
) -> Run:
    """Drive a `RateControl` as the mirror process does: each second every worker reports its
    share of the arrivals, the controller ticks, and the next second samples with its share."""
    rng = random.Random(seed)
    ctl = RateControl()
    run = Run()
    totals = dict.fromkeys(candidates, 0)
    for name in candidates:
        run.copies[name], run.share[name] = [], []
    for second, n in enumerate(arrivals):
        shares = {
            name: effective_rate(target, ceiling, ctl.reference(mode))
            for name, (target, ceiling) in candidates.items()
        }
        thresholds = {name: threshold_for(p) for name, p in shares.items()}
        copies = dict.fromkeys(candidates, 0)
        for _ in range(n):
            key = rng.getrandbits(64).to_bytes(8, "big")
            for name, threshold in thresholds.items():
                copies[name] += is_sampled(SALT, key, threshold)
        run.offered.append(n)
        for name in candidates:
            run.copies[name].append(copies[name])
            run.share[name].append(shares[name])
            totals[name] += copies[name]
        now = float(second + 1)
        for w in range(WORKERS):  # the workers split the traffic
            ctl.eligible.report(w, n // WORKERS + (w < n % WORKERS), 1.0, now)
        run.changes += ctl.tick(now, totals.items())
    return run


def test_converges_on_steady_traffic_and_stays_put() -> None:
    """Offered 200 req/s, target 20 copies/s: from the safe start the share reaches the target
    within 10 s, the realized rate over the next minute is 20 +- 15 % (the +-10 % band plus
    Poisson noise), and once settled the share does not flap (at most one change in that
    minute)."""
    run = simulate(steady(random.Random(1), 200, 70), {"c": (20.0, 1.0)})
    assert run.share["c"][0] == pytest.approx(20 / rate.START_REFERENCE_RPS)
    assert run.mean_copies("c", 10) == pytest.approx(20, rel=0.15)
    settled = run.share["c"][10:]
    assert sum(a != b for a, b in itertools.pairwise(settled)) <= 1


def test_bursty_arrivals_track_the_target() -> None:
    """On a Markov-modulated Poisson process switching between 60 and 340 req/s (holds of
    ~8 s) for 10 minutes, the mean realized rate is within 20 % of the target, a 10-s window
    is above twice the target less than 2 % of the time, and the share follows each switch in
    a few bounded steps (request mode: a change costs nothing), not at every tick."""
    run = simulate(bursty(random.Random(2), 60, 340, 8.0, 600), {"c": (20.0, 1.0)})
    copies = run.copies["c"][10:]
    assert statistics.fmean(copies) == pytest.approx(20, rel=0.20)
    windows = [sum(copies[i : i + 10]) / 10 for i in range(len(copies) - 10)]
    assert sum(w > 40 for w in windows) / len(windows) < 0.02
    switches = 600 / 8.0
    assert run.changes <= 6 * switches and run.changes < 0.6 * 600


@pytest.mark.parametrize("ceiling", [0.02, 0.1, 0.5])
def test_never_above_sample_rate(ceiling: float) -> None:
    """With a target the host cannot meet under the ceiling (bursts, a lull, silence), the
    share is never above `sample_rate` and sits at it while the target is out of reach."""
    arrivals = [
        *steady(random.Random(3), 200, 20),
        *[0] * 20,
        *bursty(random.Random(4), 5, 400, 5, 60),
    ]
    run = simulate(iter(arrivals), {"c": (1000.0, ceiling)})
    assert max(run.share["c"]) <= ceiling
    assert run.share["c"][-1] == ceiling


def test_a_fresh_start_never_floods() -> None:
    """Before the first estimate the share assumes START_REFERENCE_RPS; while it climbs (by
    at most STEP_MAX a second) the expected copies/s never exceed the target by more than
    the band, even at 2,000 req/s."""
    run = simulate(steady(random.Random(5), 2000, 15), {"c": (20.0, 1.0)})
    for share, offered in zip(run.share["c"], run.offered, strict=True):
        assert share * offered <= 20 * (1 + rate.BAND) * 1.1
    shares = run.share["c"]
    for a, b in itertools.pairwise(shares):
        assert b <= a * rate.STEP_MAX * (1 + 1e-9) and b >= a / rate.STEP_MAX / (1 + 1e-9)


def test_session_mode_holds_through_a_short_burst() -> None:
    """Session mode: the climb from the safe start is as quick as in request mode; once
    settled, a 2-s burst to twice the traffic changes nothing (a change would cut
    conversations); a sustained doubling halves the share after SESSION_HOLD_S, in one or
    two changes."""
    rng = random.Random(6)
    arrivals = [
        *steady(rng, 200, 40),
        *steady(rng, 400, 2),
        *steady(rng, 200, 30),
        *steady(rng, 400, 40),
    ]
    run = simulate(iter(arrivals), {"c": (20.0, 1.0)}, mode="session")
    shares = run.share["c"]
    assert shares[8] == pytest.approx(0.1, rel=rate.SESSION_BAND)
    assert len(set(shares[8:72])) == 1  # settled, and the burst at 40..41 did not move it
    assert shares[-1] == pytest.approx(shares[60] / 2, rel=rate.SESSION_BAND)
    later = shares[72:]
    changes = sum(a != b for a, b in itertools.pairwise(later))
    assert 1 <= changes <= 2
    first = next(i for i, (a, b) in enumerate(itertools.pairwise(later)) if a != b)
    assert first >= rate.SESSION_HOLD_S


def test_nested_across_targets_at_every_second() -> None:
    """Every candidate divides by the same reference: a lower target's share is never above a
    higher one's (so its sample is a subset at every moment), and one target with one ceiling
    is one share."""
    run = simulate(
        bursty(random.Random(8), 50, 300, 6.0, 200),
        {"low": (5.0, 1.0), "high": (20.0, 1.0), "twin": (20.0, 1.0)},
    )
    for low, high, twin in zip(run.share["low"], run.share["high"], run.share["twin"], strict=True):
        assert low <= high and high == twin
    rng = random.Random(9)
    keys = [rng.getrandbits(64).to_bytes(8, "big") for _ in range(20_000)]
    for ref in (3.0, 150.0, 9000.0):
        low_t = threshold_for(effective_rate(5.0, 1.0, ref))
        high_t = threshold_for(effective_rate(20.0, 1.0, ref))
        low = {k for k in keys if is_sampled(SALT, k, low_t)}
        high = {k for k in keys if is_sampled(SALT, k, high_t)}
        assert low <= high


def test_effective_rate_bounds() -> None:
    """No target: `sample_rate` as is. A target: target / reference, under the ceiling and over
    the floor; a reference below REFERENCE_FLOOR_RPS counts as the floor."""
    assert effective_rate(None, 0.3, 1.0) == 0.3
    assert effective_rate(20.0, 1.0, 200.0) == pytest.approx(0.1)
    assert effective_rate(20.0, 0.05, 200.0) == 0.05
    assert effective_rate(1e-3, 1.0, 1e6) == rate.P_FLOOR
    assert effective_rate(0.5, 1.0, 0.0) == 0.5
    assert effective_rate(1e-3, 1e-9, 1e6) == 1e-9  # the ceiling wins over the floor


def test_eligible_sources_and_staleness() -> None:
    """The host rate is the sum of each source's latest rate; a source silent for STALE_S
    counts 0, and a forgotten one (its worker disconnected) is gone."""
    e = EligibleRates()
    assert e.instant(0.0) is None
    e.report("a", 100, 1.0, 10.0)
    e.report("b", 50, 0.5, 10.0)
    assert e.instant(10.5) == 200.0
    e.report("a", 90, 1.0, 12.0)
    assert e.instant(10.0 + rate.STALE_S + 0.5) == 90.0
    e.forget("a")
    assert e.instant(12.0) == 100.0


def test_reference_steps_are_bounded_and_floored() -> None:
    """An estimate far away moves the reference by at most STEP_MAX per change, down to the
    floor; inside the band nothing moves."""
    ref = Reference(rate.BAND, 0.0)
    assert ref.update(rate.START_REFERENCE_RPS * 1.05, 1.0) is False
    values = []
    for t in range(12):
        ref.update(0.0, float(t))
        values.append(ref.value)
    assert values[0] == rate.START_REFERENCE_RPS / rate.STEP_MAX
    assert values[-1] == rate.REFERENCE_FLOOR_RPS


def test_realized_rate_is_reported_per_candidate() -> None:
    """The controller's realized copies/s follows each candidate's sampled counter."""
    ctl = RateControl()
    for t in range(1, 30):
        ctl.eligible.report(0, 100, 1.0, float(t))
        ctl.tick(float(t), [("c", 10 * t)])
    assert ctl.realized("c") == pytest.approx(10.0)
    assert ctl.eligible_rps == pytest.approx(100.0)
    ctl.tick(31.0, [])
    assert ctl.realized("c") is None  # a removed candidate is forgotten
