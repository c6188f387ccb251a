"""What `canary plan` states: its rows (tests, ramp steps, graded margins) as msgspec structs
(the JSON format is their encoding) and the text a terminal shows.
"""

from __future__ import annotations

import msgspec


class PlanRow(msgspec.Struct):
    metric: str
    margin: str
    units: int | None
    pairs: int | None
    seconds: float | None


class RolloutPlanRow(msgspec.Struct):
    """One step of a ramp on live traffic (`evaluators.rollout.rule.plan_rollout`): the new sessions
    (both arms) its dwell needs, what sizes it, and its expected time at the live session
    rate (at least `min_step_s`)."""

    weight: float  # percent of new sessions on the candidate
    sessions: int | None
    seconds: float | None
    sized_by: str = ""
    # False rollbacks of a candidate equal to production in this step: the tests' bound (their
    # share of alpha) and the guards' false trips over its dwell (`evaluators.rollout.guards`).
    tests_false: float = 0.0
    guards_false: float | None = None


class GradedRow(msgspec.Struct):
    """A preference margin: graded sessions a decision needs, time, grader calls and cost."""

    margin: float
    sessions: int | None
    seconds: float | None
    gradings: int | None
    tokens: int | None
    cost_usd: float | None


class LabelRow(msgspec.Struct):
    """People's check (--labels): labels a decision on people's preference needs, alone and
    prediction-powered, and the factor the grader saves (evaluators.judge.label_plan)."""

    margin: float
    effect: float
    agreement: float
    label_rate: float
    human_labels: int | None
    ppi_labels: int | None
    graded_units: int | None
    label_factor: float | None
    width_factor: float | None


class Plan(msgspec.Struct, kw_only=True):
    rate_rps: float
    sample_rate: float
    pairs_per_s: float
    turns: float
    unit: str
    alpha: float
    needs: list[PlanRow]
    dominant: str | None
    seconds_to_decide: float | None
    # The horizon the latency rows were sized at: set it on the candidate (`horizon_units`)
    # so the verdict runs the very sequences of this plan.
    horizon_units: int
    # "noise model" (the flags), or "measured: NAME, N pairs in U sessions" (--candidate).
    source: str = "noise model"
    budget_s: float | None = None
    # The smallest margins clean candidates show within the budget, or the horizon when given.
    rate_margin_in_budget: float | None = None
    latency_margin_in_budget: float | None = None
    # After a promote: each step of the default ramp (unpaired arms, every live session), from
    # the flags' rate (not with --candidate, whose rate is its sampled pairs').
    ramp: list[RolloutPlanRow] = msgspec.field(default_factory=list)
    # The whole ramp's expected time (the sum of its steps').
    ramp_seconds: float | None = None
    # The whole ramp's false rollbacks of an equal candidate: the tests' bound, the guards'
    # trips at the failing share given (--failing-share), and both (at most alpha when sized).
    ramp_tests_false: float | None = None
    ramp_guards_false: float | None = None
    ramp_false_rollback: float | None = None
    # A model upgrade (--graded): the preference margin, then twice and three times it.
    graded: list[GradedRow] = msgspec.field(default_factory=list)
    # The net preference the graded rows were planned for (--effect; 0: the candidate is equal).
    graded_effect: float = 0.0
    # People's check of the grader (--labels).
    labels: list[LabelRow] = msgspec.field(default_factory=list)


def _pct(x: float | None) -> str:
    """A probability as a percentage, small ones readable (0.0041 %, < 0.0001 %)."""
    if x is None:
        return ""
    if x == 0:
        return "0"
    if x < 1e-6:
        return "< 0.0001 %"
    return f"{x * 100:.1f} %" if x >= 0.01 else f"{x * 100:.2g} %"


def render_text(plan: Plan) -> str:
    from evaluators.judge.verdict import fmt_duration
    from gateway.cli.commands.candidates import table

    unit = plan.unit + "s"
    head = (
        f"canary plan: {plan.rate_rps:g} req/s × {plan.sample_rate:g} sampled = "
        if plan.source == "noise model"
        else f"canary plan ({plan.source}): "
    )
    lines = [
        head
        + f"{plan.pairs_per_s:.3g} pairs/s; unit of independence: {plan.unit}"
        + (f" ({plan.turns:.3g} pairs each)" if plan.turns > 1 else "")
        + f"; α = {plan.alpha:g} one-sided",
        "",
    ]
    rows = [
        [
            r.metric,
            r.margin,
            "out of reach" if r.units is None else f"{r.units:,}",
            "" if r.pairs is None else f"{r.pairs:,}",
            "" if r.seconds is None else fmt_duration(r.seconds),
        ]
        for r in plan.needs
    ]
    # Widths from the content; a test's name too long for the terminal is cut with "…".
    lines.append(table(["test", "margin", unit, "pairs", "time"], rows, flex=0, align="<>>>>"))
    lines.append("")
    if plan.seconds_to_decide is None:
        lines.append(f"dominates: {plan.dominant} (not within reach: loosen its margin)")
    else:
        lines.append(
            f"dominates: {plan.dominant}; a clean candidate can be promoted after about "
            f"{fmt_duration(plan.seconds_to_decide)}"
        )
    if plan.rate_margin_in_budget is not None or plan.latency_margin_in_budget is not None:
        rate_m = plan.rate_margin_in_budget
        lat_m = plan.latency_margin_in_budget
        within = (
            fmt_duration(plan.budget_s)
            if plan.budget_s is not None
            else f"{plan.horizon_units:,} {unit}"
        )
        lines.append(
            f"within {within}: a failure-rate margin down to "
            + ("none (too few units)" if rate_m is None else f"+{rate_m * 100:.2g} pp")
            + ", a latency margin down to "
            + ("none" if lat_m is None else f"×{lat_m:.4g}")
        )
    lines.append(
        f"horizon: {plan.horizon_units:,} {unit}; register the candidate with "
        f'verdict {{"horizon_units": {plan.horizon_units}}} so its intervals are tuned to it'
    )
    if plan.ramp:
        lines.append("")
        per_s = plan.rate_rps / plan.turns
        lines.append(f"after a promote, the ramp: every live session ({per_s:.3g} new/s); each")
        lines.append("step looks for harm at every look and dwells until a planted harm would")
        lines.append("be caught; the largest split step asks for the margins once")
        steps = [
            [
                f"{r.weight:g} %",
                "out of reach" if r.sessions is None else f"{r.sessions:,}",
                "" if r.seconds is None else fmt_duration(r.seconds),
                r.sized_by,
                _pct(r.tests_false),
                _pct(r.guards_false),
            ]
            for r in plan.ramp
        ]
        header = ["step", "sessions", "time", "sized by", "tests", "guards"]
        lines.append(table(header, steps, flex=0, align="<>><>>"))
        total = "out of reach" if plan.ramp_seconds is None else fmt_duration(plan.ramp_seconds)
        lines.append(f"the whole ramp: about {total} (100 %: no production arm; it completes")
        lines.append("after its dwell, the guards watching)")
        if plan.ramp_false_rollback is not None:
            over = plan.ramp_false_rollback > plan.alpha
            lines.append(
                f"false rollbacks of an equal candidate: tests ≤ {_pct(plan.ramp_tests_false)}"
                f" + guards {_pct(plan.ramp_guards_false)} = {_pct(plan.ramp_false_rollback)}"
                + (f" > α = {plan.alpha:g}:" if over else f" ≤ α = {plan.alpha:g}")
            )
            if over:
                lines.append("the guards trip too often at this failing share: raise")
                lines.append("rollout.guard_burst_failures / guard_consecutive_failures")
        lines.append("")
    if plan.graded:
        lines.append("a model upgrade: quality gates on the grader's net preference (agreement")
        lines.append("and output length are information); graded sessions by which 95 % of runs")
        net = f"{plan.graded_effect * 100:+g} pp"
        lines.append(f"decide (promote or reject) at a true net of {net} (--effect)")
        rows = [
            [
                f"-{r.margin * 100:g} pp",
                "out of reach" if r.sessions is None else f"{r.sessions:,}",
                "" if r.seconds is None else fmt_duration(r.seconds),
                "" if r.gradings is None else f"{r.gradings:,}",
                "" if r.tokens is None else f"{r.tokens:,}",
                "" if r.cost_usd is None else f"${r.cost_usd:,.2f}",
            ]
            for r in plan.graded
        ]
        header = ["net margin", "graded sessions", "time", "grader calls", "tokens", "cost"]
        lines.append(table(header, rows, flex=0, align="<>>>>>"))
        lines.append("a wider margin is quadratically cheaper; a clearly worse candidate is")
        lines.append("rejected far sooner than a clean one is promoted; a candidate near the")
        lines.append("margin takes longest")
        lines.append("")
    for r in plan.labels:
        lines.append("people's check (--labels): labels by which 95 % of runs decide at the")
        lines.append(
            f"-{r.margin * 100:g} pp margin, people at {r.effect * 100:+g} pp, the grader "
            f"agreeing {r.agreement:.0%}, label_rate {r.label_rate:g}"
        )
        rows = [
            ["people's labels alone", "out of reach" if r.human_labels is None
             else f"{r.human_labels:,}", ""],
            ["prediction-powered", "out of reach" if r.ppi_labels is None
             else f"{r.ppi_labels:,}", "" if r.graded_units is None
             else f"{r.graded_units:,} graded sessions"],
        ]  # fmt: skip
        lines.append(table(["estimate", "labels", "behind them"], rows, flex=0, align="<><"))
        if r.label_factor is not None:
            width = "" if r.width_factor is None else f", intervals {r.width_factor:.2f}x narrower"
            lines.append(f"the grader saves a factor {r.label_factor:.2f} in labels{width}")
        lines.append("")
    lines.append("floors: a rate within δ needs ≥ log(1/α)/(0.8 δ) units even with no")
    lines.append("discordant unit (≈3.7/δ at α = 0.05), more with background failures; add")
    lines.append("the session idle gap for the last sessions to close.")
    return "\n".join(lines) + "\n"
