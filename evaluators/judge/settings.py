"""Every margin and threshold the verdict uses, with its default, in one frozen Struct.

The gateway config's `[verdict]` table and each candidate's `verdict` are plain
`{field name: number}` maps applied with `with_overrides`, which refuses unknown names and
out-of-range values, so a typo in a config file fails loudly instead of silently using a default.

Ratio margins (latency, length, cost) are multiplicative (1.05 = 5 % worse); rate margins
(errors, agreement, SLO exceedance, similarity) are absolute differences (0.001 = 0.1 pp).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from domain.errors import InvalidSettings

# The horizon when none is set: a typical experiment of a few hundred sessions.
DEFAULT_HORIZON_UNITS = 300
# Share of alpha spent on the boundary planned to the horizon (bench/RESULTS.md, issue 19).
DEFAULT_PLANNED_SHARE = 0.9
# Whose preference may gate a graded candidate (`preference_source`).
PREFERENCE_SOURCES = ("grader", "human")
# Settings that no longer exist, with what replaced them (a stored override names them).
_RETIRED = {
    "latency_tau": "latency_tau was replaced by horizon_units (the units the experiment is "
    "planned to reach; `canary plan` states it)"
}


class VerdictSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Decision margins, gates and tuning of the statistics, each with its default."""

    # Error rate of every always-valid test and interval (one-sided, per side).
    alpha: float = 0.05
    # Shares of α in the reject test of the metrics a decision rests on (net preference,
    # people's preference, tool-call validity) against one for every other gating metric
    # (weighted Holm, verdict.py). Harm to one of them rejects at a median of 1.26-1.34x the
    # sessions its own interval needs to show it beside a model upgrade's six other gating
    # metrics, 1.38-1.49x beside an agent report's twelve, against 1.45-1.57x and 1.70-1.77x
    # at one share (bench/RESULTS.md, "Harm shown early"); α in all is unchanged.
    primary_weight: float = 3.0

    # Latency (TTFT, TPOT, E2E): ratio candidate / reference of the geometric means.
    latency_delta: float = 1.05  # non-inferiority margin
    latency_critical: float = 1.25  # decisive harm: reject at any look
    # Floor of the plug-in standard deviation of a log-ratio: guards against a zero variance
    # in the first pairs (or identical simulated arms) producing a zero-width interval.
    latency_sigma_floor: float = 0.01

    # Failures (status not 2xx, connect/reset/timeout/garbage): rate difference. Showing a rate
    # within δ needs at least log(1/α)/(0.8 δ) units even with no failure at all (382 at 1 pp,
    # α = 0.05), more with background failures (~600 sessions of 6 turns at 0.05 % per arm):
    # about half an hour at 20 req/s sampled 10 %. `canary plan` computes it for a deployment;
    # the strict preset (0.1 pp at α = 0.025, STRICT below) needs 4,708 units even then.
    error_delta: float = 0.01
    error_critical: float = 0.03

    # Agreement with production (exact match at temperature 0, tool calls, finish reason) and
    # JSON validity: rate difference against the production-vs-control noise floor.
    agreement_delta: float = 0.01
    agreement_critical: float = 0.10
    # Tool-call validity (the share of answers whose calls break the request's declared tools,
    # JSON Schema or tool_choice): candidate minus production, the reference. Absolute, so it
    # needs no control and gates for every kind, a model upgrade included. Harm beyond the
    # margin rejects at the first look that shows it, as for every betting sequence (weighted
    # Holm at α, `primary_weight` shares: STATISTICS.md "Harm shown early"); the critical margin
    # is decisive harm (at its share of the same α), as agreement's is.
    tool_validity_delta: float = 0.01
    tool_validity_critical: float = 0.05
    # Text similarity (0..1) drop against the noise floor; a guardrail only with a control.
    similarity_delta: float = 0.02
    similarity_critical: float = 0.20
    # Scoring (teacher forcing with prompt logprobs, `logprob_divergence`): the share of
    # production's tokens that are not the candidate's top-1 choice, minus the control's share
    # on the same pairs. bfloat16 against float32 on real vLLM: about +1 pp.
    score_delta: float = 0.005
    score_critical: float = 0.05
    # Preference (a candidate with an LLM grader, evaluators.metrics.preference): the
    # order-averaged net preference, wins minus losses in [-1, 1]; the candidate may lose at
    # most this much net (0.05: 5 points more losses than wins); past the critical margin it is
    # rejected at any look.
    preference_delta: float = 0.05
    preference_critical: float = 0.25
    # Share of the grader's attempts that may be unparseable or failed before preference stops
    # gating (missing verdicts are not ties: past this share they could be anything).
    grading_failure_max: float = 0.10
    # Whose preference gates (docs/grading.md, "People check the grader"): "grader" (the LLM
    # grader's net preference; people's estimate is shown beside it whenever labels exist) or
    # "human" (the prediction-powered interval on what people prefer, from `min_labels`
    # labels on; the candidate holds before, saying so).
    preference_source: str = "grader"
    # Labels before people's estimate gates: fewer cannot move a betting sequence anyway, and
    # a handful of labels says nothing about the grader's agreement.
    min_labels: int = 50
    # Share of the pairs chosen for people that may be skipped before people's estimate stops
    # gating (skipped pairs count worst-case both ways; past this share they could be anything
    # and the labelled set is no longer the random sample it was chosen as).
    label_skip_max: float = 0.10
    # A session's graded unit closes this long after its idle gap ends (its last pair plus
    # `session_idle_s`), and a verdict stored later than this after its pair arrived is late:
    # counted, never used (a unit a look used never changes). 900 s covers a pair's answers
    # (the candidate's default timeout, 300 s, plus a minute), two grader calls of
    # `grading_timeout_s` (60 s), a queue of `grading_max_pending` pairs draining at
    # `grading_concurrency`, and a grader down for a few minutes; every look of the net
    # preference trails the clock by it, a quarter of an hour in an experiment of hours.
    grading_deadline_s: float = 900.0
    # Output length ratio (two-sided: longer or shorter are both harm).
    length_delta: float = 1.10
    length_critical: float = 1.50

    # Tail latency: service-level objectives and the margin on the exceedance-rate difference.
    slo_ttft_s: float = 2.0
    slo_e2e_s: float = 30.0
    slo_exceedance_delta: float = 0.01

    # Goals by candidate kind: `bi-kv` must show TTFT on turns >= 2 below this ratio,
    # `quantized` must show cost per output token below this ratio.
    goal_ttft_ratio: float = 1.0
    goal_cost_ratio: float = 1.0

    # The horizon: units of independence (sessions when sampling by session, else pairs) the
    # experiment is planned to reach. Every normal-mixture sequence (latency, length, cost) is
    # tuned to it in units of its own variance, narrowest there (1.56x the fixed-sample width);
    # valid at every look for any horizon fixed in advance. `canary plan` states one; the
    # default suits a typical experiment of a few hundred sessions.
    horizon_units: int = DEFAULT_HORIZON_UNITS
    # Share of alpha those sequences spend on a boundary planned to the horizon (the
    # continuous-look limit of O'Brien–Fleming alpha spending: a constant boundary on the
    # standardized sum, valid at any looks up to the horizon), the rest on the normal mixture,
    # which alone holds past it. 0.9: 1.22x the fixed-sample width at the horizon (1.72x at
    # half of it, 2.1x at twice it); 0: the mixture alone (1.56x at the horizon, 1.60x at
    # half, 1.63x at twice).
    planned_share: float = DEFAULT_PLANNED_SHARE

    # Sessions: a gap longer than this between two turns of one session ends a unit of
    # independence; a unit is used once it is this old (and older than the candidate's timeout).
    session_idle_s: float = 30.0

    # The ramp (evaluators.rollout.rule): the planted harms its steps are sized to catch, with what
    # power, and from which step (percent of new sessions) each harm sizes the dwell. Below
    # `ramp_ttft_from` a step is a smoke test of `min_step_s` (the next step carries its power).
    ramp_ttft_harm: float = 1.30  # TTFT ratio candidate / production
    ramp_failure_harm: float = 0.03  # failing-session share added to production's
    ramp_power: float = 0.95  # each sized step catches a planted harm with this probability
    ramp_ni_power: float = 0.98  # the non-inferiority look shows an equal candidate within margins
    ramp_ttft_from: float = 5.0
    ramp_failure_from: float = 25.0

    # Gates.
    min_pairs: int = 200  # promote needs at least this many usable pairs
    min_metric_pairs: int = 30  # below this a metric is "insufficient data"
    min_discordant: int = 30  # McNemar p-values below this many discordant pairs are withheld
    min_coverage: float = 0.9  # fraction of sampled copies actually observed

    # Bounds on work for very large reports (documented in the report when they bite).
    hl_max_pairs: int = 10_000  # Hodges–Lehmann / Wilcoxon on a systematic subsample
    similarity_max_pairs: int = 10_000  # text similarity on a sample of about this many
    similarity_max_chars: int = 4_000
    bootstrap_draws: int = 400
    bootstrap_max_units: int = 20_000

    def with_overrides(self, overrides: Mapping[str, float | str]) -> VerdictSettings:
        """A copy with `overrides` applied; InvalidSettings (a UsageError, and a ValueError) names
        an unknown field or a bad value."""
        fields = set(self.__struct_fields__)
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name in _RETIRED:
                raise InvalidSettings(_RETIRED[name])
            if name not in fields:
                raise InvalidSettings(
                    f"unknown verdict setting {name!r}; known: {', '.join(sorted(fields))}"
                )
            default = getattr(self, name)
            if isinstance(default, str):
                if not isinstance(value, str):
                    raise InvalidSettings(f"verdict setting {name!r} must be a string")
                changes[name] = value
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSettings(f"verdict setting {name!r} must be a number, got {value!r}")
            if isinstance(default, int):
                if float(value) != int(value):
                    raise InvalidSettings(f"verdict setting {name!r} must be a whole number")
                changes[name] = int(value)
            else:
                changes[name] = float(value)
        result = msgspec.structs.replace(self, **changes)
        result.validate()
        return result

    def validate(self) -> None:
        """Raise InvalidSettings when a value is out of its meaningful range."""
        problems: list[str] = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not isinstance(value, str) and not math.isfinite(value):
                problems.append(f"{name} must be finite")
        if not 0.0 < self.alpha < 0.5:
            problems.append("alpha must be in (0, 0.5)")
        for lo, hi in (
            ("latency_delta", "latency_critical"),
            ("length_delta", "length_critical"),
        ):
            if not 1.0 < getattr(self, lo) <= getattr(self, hi):
                problems.append(f"need 1 < {lo} <= {hi}")
        for lo, hi in (
            ("error_delta", "error_critical"),
            ("agreement_delta", "agreement_critical"),
            ("tool_validity_delta", "tool_validity_critical"),
            ("similarity_delta", "similarity_critical"),
            ("score_delta", "score_critical"),
            ("preference_delta", "preference_critical"),
        ):
            if not 0.0 < getattr(self, lo) <= getattr(self, hi) < 1.0:
                problems.append(f"need 0 < {lo} <= {hi} < 1")
        if not 0.0 < self.slo_exceedance_delta < 1.0:
            problems.append("slo_exceedance_delta must be in (0, 1)")
        if not 1.0 < self.ramp_ttft_harm <= 10.0:
            problems.append("ramp_ttft_harm must be in (1, 10]")
        if not 0.0 < self.ramp_failure_harm < 1.0:
            problems.append("ramp_failure_harm must be in (0, 1)")
        problems.extend(
            f"{name} must be in [0.5, 1)"
            for name in ("ramp_power", "ramp_ni_power")
            if not 0.5 <= getattr(self, name) < 1.0
        )
        problems.extend(
            f"{name} must be in [0, 100] (percent of new sessions)"
            for name in ("ramp_ttft_from", "ramp_failure_from")
            if not 0.0 <= getattr(self, name) <= 100.0
        )
        if not 0.0 <= self.planned_share <= 0.95:
            problems.append("planned_share must be in [0, 0.95]")
        if not 0.0 <= self.grading_failure_max < 1.0:
            problems.append("grading_failure_max must be in [0, 1)")
        if self.preference_source not in PREFERENCE_SOURCES:
            problems.append(
                f"preference_source must be one of {', '.join(PREFERENCE_SOURCES)}, "
                f"got {self.preference_source!r}"
            )
        if not 1.0 <= self.primary_weight <= 100.0:
            problems.append("primary_weight must be in [1, 100]")
        if not 1 <= self.min_labels <= 1_000_000:
            problems.append("min_labels must be in [1, 1000000]")
        if not 0.0 <= self.label_skip_max < 1.0:
            problems.append("label_skip_max must be in [0, 1)")
        if not 0.0 <= self.min_coverage <= 1.0:
            problems.append("min_coverage must be in [0, 1]")
        positive = (
            "horizon_units",
            "latency_sigma_floor",
            "slo_ttft_s",
            "slo_e2e_s",
            "goal_ttft_ratio",
            "goal_cost_ratio",
            "session_idle_s",
            "grading_deadline_s",
            "min_pairs",
            "min_metric_pairs",
            "hl_max_pairs",
            "similarity_max_pairs",
            "similarity_max_chars",
            "bootstrap_draws",
            "bootstrap_max_units",
        )
        problems.extend(f"{name} must be > 0" for name in positive if getattr(self, name) <= 0)
        if not 10 <= self.horizon_units <= 10_000_000:
            problems.append("horizon_units must be in [10, 10000000]")
        if self.min_discordant < 0:
            problems.append("min_discordant must be >= 0")
        if problems:
            raise InvalidSettings("; ".join(problems))


# The strict preset (`--strict`): the margins of a slow, careful rollout. At least 4,708 units
# for the failure margin and ~940 for agreement: many hours at tens of req/s sampled at 10 %.
STRICT: dict[str, float] = {
    "alpha": 0.025,
    "error_delta": 0.001,
    "error_critical": 0.01,
    "agreement_delta": 0.005,
    "slo_exceedance_delta": 0.005,
    "latency_delta": 1.03,
}
