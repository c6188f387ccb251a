"""The workers' guard counts failing sessions for a burst and every request for a streak: a failing
three-turn session is one failure of the burst window, a dead candidate still trips at once."""

from __future__ import annotations

from gateway.rollout.arms import ArmGuard


def _interleaved(
    failing: list[int], turns: int = 3, healthy_between: int = 2
) -> list[tuple[bool, int]]:
    """Each failing session's `turns` failed requests, every one followed by successes of fresh
    healthy sessions (so no streak forms)."""
    out: list[tuple[bool, int]] = []
    healthy = 1000
    for _ in range(turns):
        for s in failing:
            out.append((True, s))
            for _ in range(healthy_between):
                healthy += 1
                out.append((False, healthy))
    return out


def test_a_failing_three_turn_session_counts_once_in_the_burst_window() -> None:
    """Two failing sessions of three failed turns each stay below a burst of 3; a third
    failing session trips it; counted per request the same stream trips at the third failure."""
    guard = ArmGuard(consecutive=5, window=50, burst=3)
    stream = _interleaved([1, 2])
    assert [guard.observe(7, f, s) for f, s in stream] == [None] * len(stream)
    assert guard.observe(7, True, 3) == "guard_burst"
    assert guard.evidence()["window_failures"] == 3
    by_request = ArmGuard(consecutive=5, window=50, burst=3)
    reasons = [by_request.observe(7, f) for f, _ in stream]
    assert reasons.index("guard_burst") == 6  # the third failed request: session 1's 2nd turn


def test_a_dead_candidate_trips_the_consecutive_guard_within_its_count() -> None:
    """Every request failing, all of one session (so the burst window holds one failure),
    trips the consecutive guard at its count."""
    guard = ArmGuard(consecutive=5, window=50, burst=10)
    assert [guard.observe(1, True, 42) for _ in range(5)] == [None] * 4 + ["guard_consecutive"]


def test_a_session_counts_again_once_its_failure_left_the_window() -> None:
    """A failing session's failure leaves the window after `window` counted requests; a later
    failure of it counts again."""
    guard = ArmGuard(consecutive=9, window=4, burst=2)
    assert guard.observe(0, True, 5) is None
    assert [guard.observe(0, False, 100 + i) for i in range(4)] == [None] * 4
    assert guard.observe(0, True, 6) is None  # session 5's failure has left the window
    assert guard.observe(0, True, 5) == "guard_burst"  # it counts again


def test_repeat_failures_are_neither_failure_nor_success_for_the_burst() -> None:
    """A counted session's further failures do not push older failures out of the window."""
    guard = ArmGuard(consecutive=99, window=3, burst=3)
    assert guard.observe(0, True, 1) is None
    for _ in range(10):
        assert guard.observe(0, True, 2) is None  # session 2 counted once; session 1 stays
    assert guard.observe(0, True, 3) == "guard_burst"


def test_the_window_holds_at_most_window_failing_sessions() -> None:
    """The set of counted sessions is bounded by the window, whatever the traffic."""
    guard = ArmGuard(consecutive=10**9, window=8, burst=8)
    for i in range(1000):
        guard.observe(0, i % 9 != 0, i)
        assert len(guard._failing) <= 8
