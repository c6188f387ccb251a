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


class RampRow(msgspec.Struct):
    """One step of a ramp on live traffic (`evaluators.ramp.rule.plan_ramp`): the new sessions
    (both arms) its dwell needs, what sizes it, and its expected time at the live session
    rate (at least `min_step_s`)."""

    weight: float  # percent of new sessions on the candidate
    sessions: int | None
    seconds: float | None
    sized_by: str = ""


class GradedRow(msgspec.Struct):
    """A preference margin: graded sessions a decision needs, time, grader calls and cost."""

    margin: float
    sessions: int | None
    seconds: float | None
    gradings: int | None
    tokens: int | None
    cost_usd: float | None


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
    ramp: list[RampRow] = msgspec.field(default_factory=list)
    # The whole ramp's expected time (the sum of its steps').
    ramp_seconds: float | None = None
    # A model upgrade (--graded): the preference margin, then twice and three times it.
    graded: list[GradedRow] = msgspec.field(default_factory=list)


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
            ]
            for r in plan.ramp
        ]
        lines.append(table(["step", "sessions", "time", "sized by"], steps, flex=0, align="<>><"))
        total = "out of reach" if plan.ramp_seconds is None else fmt_duration(plan.ramp_seconds)
        lines.append(f"the whole ramp: about {total} (100 %: no production arm; it completes")
        lines.append("after its dwell, the guards watching)")
        lines.append("")
    if plan.graded:
        lines.append("a model upgrade: quality gates on the grader's net preference (agreement")
        lines.append("and output length are information); at a true net of 0, graded sessions")
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
        lines.append("rejected far sooner than a clean one is promoted")
        lines.append("")
    lines.append("floors: a rate within δ needs ≥ log(1/α)/(0.8 δ) units even with no")
    lines.append("discordant unit (≈3.7/δ at α = 0.05), more with background failures; add")
    lines.append("the session idle gap for the last sessions to close.")
    return "\n".join(lines) + "\n"
