"""VerdictSettings: defaults are valid, overrides are checked by name and range."""

from __future__ import annotations

import pytest

from evaluators.judge.settings import STRICT, VerdictSettings


def test_defaults_match_the_statistics_spec() -> None:
    """The documented defaults: latency 1.05 / 1.25, errors +1 pp, agreement +1 pp; the strict
    preset tightens errors to +0.1 pp at α = 0.025 and is itself valid."""
    s = VerdictSettings()
    s.validate()
    assert (s.latency_delta, s.latency_critical) == (1.05, 1.25)
    assert (s.error_delta, s.agreement_delta, s.alpha) == (0.01, 0.01, 0.05)
    strict = s.with_overrides(STRICT)
    assert (strict.error_delta, strict.alpha) == (0.001, 0.025)


def test_overrides_apply_and_convert_types() -> None:
    """Known names are applied; integral floats are accepted for integer fields."""
    s = VerdictSettings().with_overrides({"latency_delta": 1.1, "min_pairs": 500.0})
    assert s.latency_delta == 1.1 and s.min_pairs == 500 and isinstance(s.min_pairs, int)
    assert VerdictSettings().with_overrides({}) == VerdictSettings()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"latency_deltaa": 1.1}, "unknown verdict setting 'latency_deltaa'"),
        ({"min_pairs": 10.5}, "whole number"),
        ({"alpha": 0.7}, "alpha"),
        ({"latency_delta": 0.9}, "latency_delta"),
        ({"error_delta": 0.05}, "error_delta <= error_critical"),
        ({"min_coverage": 1.5}, "min_coverage"),
        ({"latency_sigma_floor": float("nan")}, "finite"),
        ({"latency_tau": 0.05}, "horizon_units"),
        ({"horizon_units": 5}, "horizon_units"),
        ({"planned_share": 0.99}, "planned_share"),
        ({"planned_share": -0.1}, "planned_share"),
        ({"alpha": True}, "must be a number"),
    ],
)
def test_bad_overrides_are_refused(overrides: dict[str, float], message: str) -> None:
    """Unknown names, wrong types and out-of-range values raise ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        VerdictSettings().with_overrides(overrides)
