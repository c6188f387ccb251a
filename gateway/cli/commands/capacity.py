"""`canary capacity NAME`: the capacity of a candidate and its reference at an SLO, measured by
replaying captured conversations at a sweep of offered loads.

The reference is the candidate's control when there is one, else `--reference URL`; the live
endpoint is refused unless `--allow-live` (a load sweep drives it to its limit). The result is
printed (`--format text|json|html`) and stored, so the promotion report's cost metric uses it.
Exit codes: 0 a result was produced, 2 bad input (unknown candidate, no captured sessions, an
SLO that does not parse, a refused live endpoint), 1 the database failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from domain.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from domain.endpoint import Endpoint
    from evaluators.capacity.estimate import CapacityResult
    from evaluators.capacity.slo import Slo

DEFAULT_LOADS = "1,2,4,8,16,32"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from gateway.cli.commands.candidates import subparser

    p = subparser(
        sub,
        "capacity",
        help="capacity at an SLO of a candidate and its reference, on replayed sessions",
        description=(
            "Replay captured conversations (capture = true in the gateway config) against the "
            "candidate and its reference - the control, else --reference URL - at a sweep of "
            "concurrent conversations, keeping each conversation's turn order and think times. "
            "At each load the two arms run one after the other (order swapped every load). "
            "Reports per step and arm goodput (requests meeting every SLO per second, as "
            "`vllm bench serve --goodput`), output tokens/s, TTFT/TPOT/ITL/E2E percentiles, "
            "errors and the prefix-cache hit rate; then each arm's capacity at the SLO with a "
            "bootstrap interval across conversations, their ratio and $/1M output tokens at "
            "capacity. The result is stored for the promotion report. Exit codes: 0 done, 2 bad "
            "input, 1 the database failed."
        ),
        examples=(
            "canary capacity int8 --slo ttft=0.5s --slo tpot=50ms",
            "canary capacity pc --reference http://10.0.0.7:8000 --loads 1,2,4,8 --format html "
            "--out pc.html",
        ),
    )
    p.add_argument("name", help="the candidate")
    p.add_argument("--db", metavar="URL", help="database URL (default: db_url from the config)")
    p.add_argument("--config", metavar="FILE", help="gateway config file (db_url)")
    p.add_argument(
        "--reference", metavar="URL", help="the reference endpoint when there is no control"
    )
    p.add_argument(
        "--reference-price-per-hour",
        type=float,
        metavar="USD",
        help="price x GPUs of --reference per hour (default: the live endpoint's)",
    )
    p.add_argument(
        "--allow-live",
        action="store_true",
        help="allow the live endpoint as an arm (the load sweep drives it past its SLO)",
    )
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an objective: ttft, tpot or e2e, in s or ms (repeatable; default ttft=0.5s)",
    )
    p.add_argument(
        "--attainment",
        type=float,
        default=0.9,
        help="share of a step's requests that must meet the SLO for it to pass (0.9)",
    )
    p.add_argument(
        "--loads",
        default=DEFAULT_LOADS,
        metavar="N,N,...",
        help=f"offered loads, concurrent conversations, increasing ({DEFAULT_LOADS})",
    )
    p.add_argument("--step-seconds", type=float, default=20.0, help="length of a step (20)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per load and arm, interleaved and pooled (1; more resists a noisy host)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, s (60)")
    p.add_argument(
        "--think-scale", type=float, default=1.0, help="multiplies captured think times (1)"
    )
    p.add_argument(
        "--max-sessions", type=int, default=1000, help="conversations loaded, newest first"
    )
    p.add_argument("--since", metavar="T", help="only captures since T (epoch, ISO, or 2h, 7d)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates (1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text", help="(text)")
    p.add_argument("--out", metavar="FILE", help="write the result here instead of stdout")
    p.add_argument("--no-store", action="store_true", help="do not store the result")
    p.set_defaults(func=run)


def parse_loads(value: str) -> tuple[int, ...]:
    try:
        loads = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--loads: {value!r} is not a comma-separated list of integers") from None
    if not loads or any(n < 1 for n in loads) or list(loads) != sorted(set(loads)):
        raise UsageError(f"--loads: {value!r}: give positive, strictly increasing integers")
    return loads


def _check(args: argparse.Namespace) -> tuple[str, Slo, tuple[int, ...]]:
    from evaluators.capacity.slo import parse_slo
    from gateway.config.load import check_http_url, load_config

    slo = parse_slo(args.slo or ["ttft=0.5s"])
    loads = parse_loads(args.loads)
    if not 0 < args.attainment <= 1:
        raise UsageError(f"--attainment: must be in (0, 1], got {args.attainment}")
    for flag, value in (("--step-seconds", args.step_seconds), ("--timeout", args.timeout)):
        if not value > 0:
            raise UsageError(f"{flag}: must be positive, got {value}")
    if args.think_scale < 0 or args.max_sessions < 1 or args.bootstrap < 10 or args.repeats < 1:
        raise UsageError(
            "--think-scale must be >= 0, --max-sessions >= 1, --bootstrap >= 10, --repeats >= 1"
        )
    if args.reference and (reason := check_http_url(args.reference)):
        raise UsageError(f"--reference: {reason}")
    url: str = args.db or load_config(args.config).storage.db_url
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise UsageError(
            f"--db: must start with sqlite+aiosqlite:// or postgresql+asyncpg://, got {url!r}"
        )
    return url, slo, loads


def _hourly(ep: Endpoint | None) -> float | None:
    if ep is None or ep.price_per_hour_usd is None:
        return None
    return ep.price_per_hour_usd * ep.gpus


def _same(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def _token(ep: Endpoint | None) -> str | None:
    # A variable's name is stored, never the secret; the CLI runs where the gateway runs.
    return os.environ.get(ep.credentials_env) if ep and ep.credentials_env else None


async def _measure(
    url: str, args: argparse.Namespace, slo: Slo, loads: tuple[int, ...]
) -> CapacityResult:
    from evaluators.capacity.estimate import ArmInput, StepData, estimate
    from gateway.capacity.replay import Arm
    from gateway.capacity.sweep import SweepPlan, run_sweep
    from gateway.cli.commands.report import parse_time
    from gateway.cli.progress import Progress
    from storage import queries
    from storage.capacity.captures import load_sessions
    from storage.capacity.runs import save_capacity
    from storage.engine import ensure_schema, make_engine

    engine = make_engine(url)
    try:
        await ensure_schema(engine, url, auto_upgrade_empty_sqlite=False)
        _, endpoints = await queries.load_endpoints(engine)
        by_name = {e.name: e for e in endpoints}
        cand = by_name.get(args.name)
        if cand is None or cand.role != "candidate":
            names = ", ".join(e.name for e in endpoints if e.role == "candidate") or "none"
            raise UsageError(f"unknown candidate {args.name!r} (candidates: {names})")
        live = next((e for e in endpoints if e.role == "live"), None)
        controls = [
            e
            for e in endpoints
            if e.role == "candidate" and e.kind == "control" and e.state == "active"
            if e.name != cand.name
        ]
        control = max(controls, key=lambda e: e.updated_at or 0.0) if controls else None
        if args.reference:
            ref_name, ref_url = "reference", args.reference
            ref_price = args.reference_price_per_hour or _hourly(live)
            ref_token = None
        elif control is not None:
            ref_name, ref_url, ref_price = control.name, control.url, _hourly(control)
            ref_token = _token(control)
        else:
            raise UsageError(
                f"candidate {cand.name!r} has no control; name a reference with --reference URL"
            )
        if live is not None and not args.allow_live:
            for role, arm_url in (("candidate", cand.url), ("reference", ref_url)):
                if _same(arm_url, live.url):
                    raise UsageError(
                        f"the {role} {arm_url} is the live endpoint; a load sweep drives it past "
                        "its SLO - pass --allow-live to do it anyway"
                    )
        since = parse_time(args.since) if args.since else None
        pool = await load_sessions(engine, since=since, limit=args.max_sessions)
        if not pool:
            raise UsageError(
                "no captured sessions to replay: turn capture on (capture = true in the gateway "
                "config) and let traffic through, or widen --since"
            )
        plan = SweepPlan(
            loads=loads,
            step_s=args.step_seconds,
            timeout_s=args.timeout,
            slo=slo,
            attainment=args.attainment,
            think_scale=args.think_scale,
            repeats=args.repeats,
        )
        bar = Progress(2 * len(loads), f"capacity {cand.name}")

        def on_step(role: str, data: StepData, passed: bool) -> None:
            bar.advance()

        with bar:
            outcome = await run_sweep(
                Arm(name=cand.name, url=cand.url, model=cand.model, token=_token(cand)),
                Arm(name=ref_name, url=ref_url, model=None, token=ref_token),
                pool,
                plan,
                on_step=on_step,
            )
        cand_p, ref_p = _hourly(cand), ref_price
        result = estimate(
            ArmInput(
                endpoint=cand.name,
                url=cand.url,
                steps=outcome.candidate,
                usd_per_hour=cand_p,
            ),
            ArmInput(endpoint=ref_name, url=ref_url, steps=outcome.reference, usd_per_hour=ref_p),
            slo,
            attainment=args.attainment,
            n_boot=args.bootstrap,
            seed=args.seed,
        )
        if outcome.repeated:
            result.notes.append(
                f"{len(pool)} captured conversations; {outcome.repeated} were replayed again at "
                "a later load (a prefix cache may remember them)"
            )
        if not args.no_store:
            await save_capacity(engine, summary_values(result))
        return result
    finally:
        await engine.dispose()


def summary_values(result: CapacityResult) -> dict[str, Any]:
    """The columns of the stored row, from a result."""
    from evaluators.capacity.render import to_json

    c, r = result.candidate, result.reference
    return {
        "endpoint": c.endpoint,
        "reference": r.endpoint,
        "created_at": time.time(),
        "load_unit": result.load_unit,
        "slo": result.slo,
        "capacity": c.capacity,
        "capacity_low": c.capacity_low,
        "capacity_high": c.capacity_high,
        "reference_capacity": r.capacity,
        "reference_low": r.capacity_low,
        "reference_high": r.capacity_high,
        "ratio": result.ratio,
        "ratio_low": result.ratio_low,
        "ratio_high": result.ratio_high,
        "usd_per_1m_tokens": c.usd_per_1m_tokens,
        "reference_usd_per_1m_tokens": r.usd_per_1m_tokens,
        "result_json": to_json(result),
    }


def run(args: argparse.Namespace) -> int:
    from evaluators.capacity.render import render_html, render_text, to_json

    url, slo, loads = _check(args)
    result = asyncio.run(_measure(url, args, slo, loads))
    render = {"text": render_text, "json": to_json, "html": render_html}[args.format]
    text = render(result)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"{result.candidate.endpoint}: capacity result written to {args.out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK
