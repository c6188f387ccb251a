"""`canary plan`: how many pairs, and how long, each gating test needs, before an experiment.

The live request rate is given (`--rate`) or measured from a running gateway's `/metrics`
(`--gateway URL`: `canary_proxy_requests_total` read twice, `--probe-s` apart). The sizing
itself is `evaluators.judge.plan` (pure). Exit codes: 0 plan written, 2 bad input, 1 the
gateway could not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import time
from typing import Any

import msgspec

from domain.errors import EXIT_FAILURE, EXIT_OK, CanaryError, UsageError
from gateway.cli.plan_view import (
    GradedRow,
    LabelRow,
    Plan,
    PlanRow,
    RolloutPlanRow,
    render_text,
)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_REQUESTS = re.compile(r"^canary_proxy_requests_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)
# Bound on one /metrics read: the command must not hang on a stuck gateway.
_SCRAPE_TIMEOUT_S = 10.0
# A ramp step needing more sessions than this is stated as out of reach.
MAX_ROLLOUT_SESSIONS = 10_000_000


class GatewayUnreadable(CanaryError):
    """The gateway's /metrics could not be read."""

    exit_code = EXIT_FAILURE


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from gateway.cli.commands.candidates import subparser

    p = subparser(
        sub,
        "plan",
        help="size an experiment: pairs and time each guardrail needs, which one dominates",
        description=(
            "Before mirroring, say how long a verdict will take: for each gating test (failure "
            "rate, agreement, SLO exceedance, latency, output length, the goal) the units of "
            "independence (sessions when sampling by session, else requests), pairs and "
            "wall-clock time needed to show it inside its margin at the live request rate and "
            "sample rate, which test dominates, and with --budget the smallest margins that "
            "fit. Margins are the verdict settings' defaults unless given; --strict uses the "
            "strict preset. Exit codes: 0 plan written, 2 bad input, 1 the gateway failed."
        ),
        examples=(
            "canary plan --rate 20 --sample-rate 0.1 --turns 6",
            "canary plan --gateway http://127.0.0.1:8080 --sample-rate 0.1 --budget 1h",
            "canary plan --rate 200 --sample-rate 0.05 --turns 1 --strict --format json",
            "canary plan --rate 2 --sample-rate 1 --turns 3 --noise 1.1 --horizon 200",
            "canary plan --candidate bi-kv --db sqlite+aiosqlite:///canary.db",
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rate", type=float, metavar="RPS", help="live requests per second")
    src.add_argument("--gateway", metavar="URL", help="measure the rate from this gateway")
    src.add_argument(
        "--candidate",
        metavar="NAME",
        help="size from a running experiment: this candidate's pairs so far (its noise per "
        "gating test, its pair rate, its margins), read from the database",
    )
    p.add_argument("--db", metavar="URL", help="with --candidate: database URL (or --config)")
    p.add_argument("--config", metavar="FILE", help="with --candidate: gateway config file")
    p.add_argument(
        "--since",
        metavar="T",
        help="with --candidate: only pairs since T (epoch seconds, ISO 8601, or an age like "
        "2h); default: since the candidate was registered",
    )
    p.add_argument("--probe-s", type=float, default=10.0, help="seconds between two reads")
    p.add_argument("--sample-rate", type=float, default=0.1, help="share mirrored (0.1)")
    p.add_argument(
        "--turns", type=float, default=6.0, help="turns per session; 1 = sampling by request"
    )
    p.add_argument("--budget", metavar="DURATION", help="e.g. 1h: the margins that fit in it")
    p.add_argument("--strict", action="store_true", help="the strict preset of margins")
    p.add_argument("--alpha", type=float, help="one-sided error rate of every test")
    p.add_argument("--error-delta", type=float, help="failure-rate margin (0.01 = 1 pp)")
    p.add_argument("--agreement-delta", type=float, help="agreement margin")
    p.add_argument("--slo-delta", type=float, help="SLO exceedance margin")
    p.add_argument("--latency-delta", type=float, help="latency ratio margin (1.05)")
    p.add_argument(
        "--noise", type=float, default=0.14, help="sd of one pair's latency log-ratio (0.14)"
    )
    p.add_argument(
        "--failures", type=float, default=0.001, help="share of pairs where one arm failed"
    )
    p.add_argument(
        "--disagreement",
        type=float,
        default=0.02,
        help="share of pairs where one of candidate / control differs at T=0 (0.02)",
    )
    p.add_argument(
        "--tool-discordance",
        type=float,
        default=0.0,
        help="share of pairs where exactly one arm's tool calls are invalid (0; agent traffic "
        "with 1 %% invalid calls on each arm: 0.02)",
    )
    p.add_argument(
        "--goal-ratio",
        type=float,
        help="improvement the goal should show (0.8; with --candidate: the one measured so far)",
    )
    p.add_argument(
        "--horizon",
        type=int,
        metavar="UNITS",
        help="size at this horizon (sessions, or requests); default: the plan's own",
    )
    p.add_argument(
        "--score-rate",
        type=float,
        default=0.1,
        help="share of pairs scored with prompt logprobs (0.1, quantized's default; 0: none)",
    )
    p.add_argument(
        "--session-noise",
        type=float,
        default=0.8,
        help="the ramp's noise: per-session standard deviation of a session's mean log TTFT "
        "in one arm (default 0.8; sessions of the ramp are unpaired)",
    )
    p.add_argument(
        "--failing-share",
        type=float,
        default=0.02,
        help="the ramp's production share of sessions with a failed request (default 0.02); "
        "sizes the failure test's dwell and states the guards' false trips",
    )
    g = p.add_argument_group("a model upgrade judged by an LLM grader (docs/grading.md)")
    g.add_argument(
        "--graded",
        action="store_true",
        help="the candidate has a grader: state the graded sessions and cost a preference "
        "decision needs",
    )
    g.add_argument(
        "--preference-delta", type=float, help="net preference margin (0.05 = 5 pp net loss)"
    )
    g.add_argument(
        "--grader-sd",
        type=float,
        default=0.9,
        help="sd of one graded session's mean verdict score (0.9: about 80 %% decisive)",
    )
    g.add_argument(
        "--effect",
        type=float,
        default=0.0,
        help="the net preference you expect of the candidate (-0.03 = 3 pp net loss; default 0)",
    )
    g.add_argument("--grader-rate", type=float, default=1.0, help="share of pairs graded (1)")
    g.add_argument("--swap-rate", type=float, default=0.25, help="share graded both ways (0.25)")
    g.add_argument("--grader-tokens", type=float, default=1500.0, help="tokens per grading (1500)")
    g.add_argument("--grader-price", type=float, default=0.0, help="USD per 1M grader tokens")
    g.add_argument(
        "--labels",
        action="store_true",
        help="with --graded: the labels people's check needs at the preference margin, alone "
        "and prediction-powered (docs/grading.md, People check the grader)",
    )
    g.add_argument(
        "--agreement",
        type=float,
        help="share of pairs the grader and people agree on (default: the candidate's measured "
        "share with --candidate, else 0.8)",
    )
    g.add_argument(
        "--label-rate",
        type=float,
        help="share of graded sessions kept for people (default: the candidate's, else 0.1)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def parse_duration(value: str) -> float:
    """Seconds from `3600`, `90s`, `45m`, `2h` or `1d`."""
    m = _DURATION.match(value.strip())
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--budget: {value!r} is not a duration like 45m, 2h or 3600")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _check(args: argparse.Namespace) -> None:
    def bad(flag: str, value: float, rule: str) -> UsageError:
        return UsageError(f"{flag}: {value!r} must be {rule}")

    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise bad("--rate", args.rate, "a positive number of requests per second")
    if not 0 < args.sample_rate <= 1:
        raise bad("--sample-rate", args.sample_rate, "in (0, 1]")
    if not (math.isfinite(args.turns) and args.turns >= 1):
        raise bad("--turns", args.turns, ">= 1")
    if not (math.isfinite(args.session_noise) and args.session_noise > 0):
        raise bad("--session-noise", args.session_noise, "> 0")
    if not (math.isfinite(args.failing_share) and 0.0 <= args.failing_share < 0.5):
        raise bad("--failing-share", args.failing_share, "in [0, 0.5)")
    if not 0 < args.probe_s <= 600:
        raise bad("--probe-s", args.probe_s, "in (0, 600]")
    if not (math.isfinite(args.noise) and args.noise > 0):
        raise bad("--noise", args.noise, "> 0")
    if not 0 <= args.score_rate <= 1:
        raise bad("--score-rate", args.score_rate, "in [0, 1]")
    if not 0 <= args.failures < 1:
        raise bad("--failures", args.failures, "in [0, 1)")
    if not 0 <= args.disagreement < 1:
        raise bad("--disagreement", args.disagreement, "in [0, 1)")
    if not 0 <= args.tool_discordance < 1:
        raise bad("--tool-discordance", args.tool_discordance, "in [0, 1)")
    if args.horizon is not None and not 10 <= args.horizon <= 10_000_000:
        raise bad("--horizon", args.horizon, "in [10, 10000000]")
    if args.goal_ratio is not None and not 0 < args.goal_ratio < 1:
        raise bad("--goal-ratio", args.goal_ratio, "in (0, 1): an improvement")
    if args.preference_delta is not None and not 0 < args.preference_delta < 1:
        raise bad("--preference-delta", args.preference_delta, "in (0, 1)")
    if not (math.isfinite(args.grader_sd) and 0 < args.grader_sd <= 1):
        raise bad("--grader-sd", args.grader_sd, "in (0, 1]")
    if not (math.isfinite(args.effect) and -1 < args.effect < 1):
        raise bad("--effect", args.effect, "in (-1, 1): a net preference")
    if args.grader_sd > math.sqrt(1.0 - args.effect**2) + 1e-12:
        raise UsageError(
            f"--grader-sd {args.grader_sd!r} is not possible at --effect {args.effect!r}: scores "
            f"in [-1, 1] with that mean have an sd of at most {math.sqrt(1 - args.effect**2):.3f}"
        )
    if not 0 < args.grader_rate <= 1:
        raise bad("--grader-rate", args.grader_rate, "in (0, 1]")
    if args.labels and not args.graded:
        raise UsageError("--labels: needs --graded (people check a grader)")
    if args.agreement is not None and not 0 <= args.agreement <= 1:
        raise bad("--agreement", args.agreement, "in [0, 1]")
    if args.label_rate is not None and not 0 < args.label_rate <= 1:
        raise bad("--label-rate", args.label_rate, "in (0, 1]")
    if not 0 <= args.swap_rate <= 1:
        raise bad("--swap-rate", args.swap_rate, "in [0, 1]")
    if not (math.isfinite(args.grader_tokens) and args.grader_tokens > 0):
        raise bad("--grader-tokens", args.grader_tokens, "> 0")
    if not (math.isfinite(args.grader_price) and args.grader_price >= 0):
        raise bad("--grader-price", args.grader_price, ">= 0")


def _settings(args: argparse.Namespace) -> Any:
    from evaluators.judge.settings import STRICT, VerdictSettings

    overrides: dict[str, float] = dict(STRICT) if args.strict else {}
    for flag, name in (
        ("alpha", "alpha"),
        ("error_delta", "error_delta"),
        ("agreement_delta", "agreement_delta"),
        ("slo_delta", "slo_exceedance_delta"),
        ("latency_delta", "latency_delta"),
        ("preference_delta", "preference_delta"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[name] = value
    s = VerdictSettings()
    # A looser failure margin than the default critical one would fail validation: raise the
    # critical margin with it, it is not what a plan sizes.
    if overrides.get("error_delta", 0) > s.error_critical:
        overrides["error_critical"] = min(0.99, overrides["error_delta"])
    if overrides.get("agreement_delta", 0) > s.agreement_critical:
        overrides["agreement_critical"] = min(0.99, overrides["agreement_delta"])
    if overrides.get("latency_delta", 0) > s.latency_critical:
        overrides["latency_critical"] = overrides["latency_delta"]
    if overrides.get("preference_delta", 0) > s.preference_critical:
        overrides["preference_critical"] = min(0.99, overrides["preference_delta"])
    return s.with_overrides(overrides)


async def _scrape(url: str) -> float:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=_SCRAPE_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + "/metrics") as resp,
        ):
            if resp.status != 200:
                raise GatewayUnreadable(f"{url}/metrics answered HTTP {resp.status}")
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise GatewayUnreadable(f"cannot read {url}/metrics: {exc}") from exc
    values = _REQUESTS.findall(text)
    if not values:
        raise GatewayUnreadable(f"{url}/metrics has no canary_proxy_requests_total")
    return sum(float(v) for v in values)


async def measure_rate(url: str, probe_s: float) -> float:
    """Live requests per second from two reads of the gateway's request counter."""
    if not re.match(r"^https?://", url):
        raise UsageError(f"--gateway: {url!r} is not an http(s) URL")
    first, t0 = await _scrape(url), time.monotonic()
    await asyncio.sleep(probe_s)
    second, t1 = await _scrape(url), time.monotonic()
    rate = (second - first) / (t1 - t0)
    if rate <= 0:
        raise GatewayUnreadable(f"{url} served no request in {probe_s:g} s: give --rate")
    return rate


def rollout_rows(
    rate_rps: float, turns: float, noise: float, failing_share: float, settings: Any
) -> list[RolloutPlanRow]:
    """Each default step's expected dwell by the ramp's rule (evaluators.rollout.rule.plan_rollout):
    a smoke step of min_step_s, steps sized to catch the planted harms, the non-inferiority
    look at the largest split step, and 100 % after its dwell."""
    from domain.records import DEFAULT_STEPS
    from evaluators.rollout.rule import plan_rollout
    from gateway.config.sections import RolloutConfig

    per_s = rate_rps / max(1.0, turns)
    plan = plan_rollout(
        DEFAULT_STEPS,
        sessions_per_s=per_s,
        noise=noise,
        failing_share=failing_share,
        min_step_s=RolloutConfig().default_min_step_s,
        settings=settings,
    )
    rows = [
        RolloutPlanRow(p.weight_pct, math.ceil(p.sessions), p.seconds, p.sized_by)
        if p.sessions < MAX_ROLLOUT_SESSIONS
        else RolloutPlanRow(p.weight_pct, None, None, p.sized_by)
        for p in plan
    ]
    _false_rollbacks(rows, per_s, turns, failing_share, settings)
    return rows


def _false_rollbacks(
    rows: list[RolloutPlanRow], per_s: float, turns: float, failing_share: float, settings: Any
) -> None:
    """Each step's share of false rollbacks of an equal candidate: its tests' bound (their
    share of alpha) and the guards' false trips over its dwell at the failing share given
    (`evaluators.rollout.guards`, with the config's guard defaults)."""
    from dataclasses import replace

    from evaluators.rollout.guards import WORLD, step_guard_trips
    from evaluators.rollout.rule import DETERIORATION, harm_alpha
    from gateway.config.sections import RolloutConfig

    config = RolloutConfig()
    world = replace(WORLD, sessions_per_s=per_s, failing_share=failing_share, turns=turns)
    steps = [r.weight for r in rows]
    per_test = harm_alpha(settings, steps)
    for r in rows:
        r.tests_false = len(DETERIORATION) * per_test if r.weight < 100.0 else 0.0
        if r.seconds is not None:
            r.guards_false = step_guard_trips(
                r.weight / 100.0, r.seconds, world,
                consecutive=config.guard_consecutive_failures,
                window=config.guard_burst_window,
                burst=config.guard_burst_failures,
            ).either  # fmt: skip


def build_plan(args: argparse.Namespace, rate: float, measured: Any = None) -> Plan:
    """The plan from the flags' noise model, or from `measured` (a candidate's report)."""
    from domain.kinds import score_rate as kind_score_rate
    from evaluators.judge import plan as core

    s = _settings(args)
    turns = args.turns
    source = "noise model"
    scoring: dict[str, float] = {"score_rate": args.score_rate}
    if measured is not None:
        report, s = measured
        ps = report.pairs
        if ps.n < 2:
            raise UsageError(
                f"--candidate {report.candidate}: {ps.n} pairs so far; a plan from measured "
                "noise needs a running experiment (or give --rate and --noise)"
            )
        turns = ps.n / ps.sessions if ps.sessions else 1.0
        span = (ps.window_end or 0.0) - (ps.window_start or 0.0)
        rate = ps.n / span if span > 0 else 1.0
        source = (
            f"measured: {report.candidate}, {ps.n:,} pairs"
            + (f" in {ps.sessions:,} sessions" if ps.sessions else "")
            + " so far"
        )
        # The divergence test once, on the scored pairs: the share and noise they measured,
        # else (nothing scored yet) the candidate kind's default share, never the flag's.
        found = core.measured_scoring(list(report.metrics.values()), ps.n)
        scoring = (
            {"score_rate": found[0], "score_sd": found[1]}
            if found is not None
            else {"score_rate": kind_score_rate(report.kind, None)}
        )
    traffic = core.Traffic(
        rate_rps=rate,
        sample_rate=args.sample_rate if measured is None else 1.0,
        turns=max(1.0, turns),
        sd_pair=args.noise,
        discordance=args.failures,
        disagreement=args.disagreement,
        tool_discordance=args.tool_discordance,
        goal_ratio=args.goal_ratio if args.goal_ratio is not None else 0.8,
        **scoring,
    )
    if measured is None:
        rows = core.noise_rows(traffic, s, goal=True, first_turn=True)
    else:
        rows = core.measured_rows(list(report.metrics.values()), s, goal_ratio=args.goal_ratio)
        rows.append(
            core.FixedRow(
                "minimum pairs gate",
                f"{s.min_pairs:,} pairs",
                math.ceil(s.min_pairs / traffic.turns),
            )
        )
    needs, horizon = core.needs(traffic, s, rows=rows, horizon=args.horizon)
    out = [PlanRow(n.metric, n.margin, n.units, n.pairs, n.seconds) for n in needs]
    known = [r for r in out if r.seconds is not None]
    out_of_reach = [r for r in out if r.seconds is None]
    worst = out_of_reach[0] if out_of_reach else max(known, key=lambda r: r.seconds or 0.0)
    dominant, seconds = worst.metric, worst.seconds
    together = horizon * traffic.turns / traffic.pairs_per_s
    if args.horizon is None and seconds is not None and together > seconds:
        # The plan's own horizon: 95 % of runs show every test together by then, which takes
        # longer than the slowest test alone when several are close to it.
        dominant, seconds = f"every test together (slowest alone: {worst.metric})", together
    result = Plan(
        rate_rps=rate,
        sample_rate=traffic.sample_rate,
        pairs_per_s=traffic.pairs_per_s,
        turns=traffic.turns,
        unit="session" if traffic.turns > 1 else "request",
        alpha=s.alpha,
        needs=out,
        dominant=dominant,
        seconds_to_decide=seconds,
        horizon_units=horizon,
        source=source,
    )
    if measured is None:
        result.ramp = rollout_rows(rate, turns, args.session_noise, args.failing_share, s)
        if all(r.seconds is not None for r in result.ramp):
            result.ramp_seconds = math.fsum(r.seconds or 0.0 for r in result.ramp)
        from evaluators.rollout.guards import false_rollbacks

        errors = false_rollbacks([r.tests_false for r in result.ramp],
                                 [r.guards_false for r in result.ramp])  # fmt: skip
        result.ramp_tests_false, result.ramp_guards_false, result.ramp_false_rollback = errors
    if args.graded:
        result.graded = graded_rows(args, s, traffic.pairs_per_s, traffic.turns)
        result.graded_effect = args.effect
        if args.labels:
            result.labels = label_rows(args, s, measured)
    units: float | None = None
    if args.budget:
        result.budget_s = parse_duration(args.budget)
        units = result.budget_s * traffic.pairs_per_s / traffic.turns
    elif args.horizon:
        units = float(args.horizon)
    if units is not None:
        rate_m, lat_m = core.margins_within(
            units, rows, s, discordance=traffic.discordance, turns=round(traffic.turns)
        )
        result.rate_margin_in_budget = rate_m
        result.latency_margin_in_budget = lat_m
    return result


def graded_rows(args: argparse.Namespace, s: Any, pairs_per_s: float, turns: float
                ) -> list[GradedRow]:  # fmt: skip
    """The preference test at its margin and at twice and three times it (what a wider margin
    buys), for the sd and net preference given, from the verdict's own sequence and rule
    (`evaluators.judge.preference_plan`): the sessions by which 95 % of runs decide."""
    from evaluators.judge.preference_plan import preference_plan

    margins = tuple(min(0.9, s.preference_delta * k) for k in (1, 2, 3))
    found = preference_plan(
        margins,
        alpha=s.alpha,
        sd=args.grader_sd,
        effect=args.effect,
        critical=s.preference_critical,
        pairs_per_session=turns,
        swap_rate=args.swap_rate,
        tokens_per_grading=args.grader_tokens,
        price_per_mtok=args.grader_price,
    )
    sessions_per_s = pairs_per_s * args.grader_rate / max(turns, 1.0)
    return [
        GradedRow(
            p.margin,
            p.sessions,
            None if p.sessions is None else p.sessions / sessions_per_s,
            p.gradings,
            p.tokens,
            p.cost_usd,
        )
        for p in found
    ]


def label_rows(args: argparse.Namespace, s: Any, measured: Any) -> list[LabelRow]:
    """People's check at the preference margin: labels alone and prediction-powered, at the
    agreement and label rate given, else the candidate's measured ones, else 0.8 and 0.1."""
    from evaluators.judge.label_plan import label_plan

    detail: dict[str, Any] = {}
    if measured is not None:
        found = measured[0].metrics.get("human_preference")
        detail = dict(found.detail) if found is not None else {}
    agreement = args.agreement
    if agreement is None:
        agreement = detail.get("agreement_share") or 0.8
    rate = args.label_rate
    if rate is None:
        rate = detail.get("label_rate") or 0.1
    (p,) = label_plan(
        (s.preference_delta,),
        settings=s,
        effect=args.effect,
        agreement=float(agreement),
        rate=float(rate),
        sd=args.grader_sd,
    )
    return [
        LabelRow(p.margin, p.effect, p.agreement, p.rate, p.human_labels, p.ppi_labels,
                 p.graded_units, p.label_factor, p.width_factor)
    ]  # fmt: skip


async def _measured(args: argparse.Namespace) -> tuple[Any, Any]:
    """(the candidate's report over its pairs so far, its verdict settings)."""
    from evaluators.pairs import load as store
    from evaluators.report.build import evaluate
    from gateway.cli.commands.report import _settings as report_settings
    from gateway.cli.commands.report import parse_time
    from storage.engine import ensure_schema, make_engine

    ns = argparse.Namespace(db=args.db, config=args.config, strict=args.strict)
    url, settings, spill = report_settings(ns)
    engine = make_engine(url)
    try:
        await ensure_schema(engine, url, auto_upgrade_empty_sqlite=False)
        cand, _, _ = await store.load_endpoints(engine, args.candidate)
        s = settings.with_overrides(cand.verdict)
        since = parse_time(args.since) if args.since else None
        report = await evaluate(engine, args.candidate, since=since, settings=settings, spill=spill)
    finally:
        await engine.dispose()
    return report, s


def run(args: argparse.Namespace) -> int:
    import sys

    _check(args)
    if args.budget:
        parse_duration(args.budget)  # fail fast, before a probe of the gateway
    _settings(args)
    measured = None
    if args.candidate is not None:
        measured = asyncio.run(_measured(args))  # EndpointNotFound for an unknown name
        rate = 1.0
    elif args.rate is not None:
        rate = args.rate
    else:
        rate = asyncio.run(measure_rate(args.gateway, args.probe_s))
    result = build_plan(args, rate, measured)
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
    else:
        sys.stdout.write(render_text(result))
    return EXIT_OK
