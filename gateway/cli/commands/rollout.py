"""`canary rollout start|status|pause|resume|advance|abort`: the ramp of a candidate on live
traffic, through the admin API of a running gateway.

`start` is refused (exit 2, the verdict on stderr) unless the candidate's report says
`promote` or `--force` is given with a `--reason`; bad steps are refused here, before any
request, with the same rule the API applies (`domain.records.check_steps`).
"""

from __future__ import annotations

import argparse
import datetime
from typing import TYPE_CHECKING, Any

from domain.errors import UsageError
from gateway.cli.commands.candidates import (
    add_admin_options,
    call_admin,
    dump_json,
    subparser,
    table,
)

if TYPE_CHECKING:
    from gateway.cli.client import AdminClient
    from gateway.control.admin.schema import RolloutView

ACTIONS = {
    "pause": "hold the weight where it is; the controller stops judging",
    "resume": "let a paused rollout run again",
    "advance": "move a running rollout to the next step now, whatever the dwell",
    "abort": "send every session back to production at once and close the rollout",
}
EVENTS_SHOWN = 10


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def _text(r: RolloutView) -> str:
    if r.state == "none":
        return "no rollout yet (`canary rollout start NAME`)"
    steps = ", ".join(
        f"[{s:g}]" if i == r.step and r.state in ("running", "paused") else f"{s:g}"
        for i, s in enumerate(r.steps)
    )
    head = [
        f"rollout {r.id} of {r.candidate} against {r.live}: {r.state}, {r.weight:g} % of new "
        "sessions",
        f"steps (percent): {steps}; at least {r.min_step_s:g} s per step",
        f"started {_when(r.started_at)}; this step since {_when(r.step_started_at)}",
    ]
    if not r.events:
        return "\n".join(head)
    rows = [
        (
            _when(e.at),
            e.kind,
            f"{e.from_weight:g} -> {e.to_weight:g}",
            e.actor,
            e.reason.replace("\n", " "),
        )
        for e in r.events[-EVENTS_SHOWN:]
    ]
    events = table(("AT", "EVENT", "WEIGHT %", "BY", "REASON"), rows)
    return "\n".join([*head, "", events])


def _steps(text: str) -> list[float]:
    from domain.records import check_steps

    try:
        steps = [float(s) for s in text.split(",") if s.strip()]
        check_steps(steps)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of percents: {text!r}") from exc
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return steps


def _out(args: argparse.Namespace, r: RolloutView) -> str:
    return dump_json(r) if args.format == "json" else _text(r)


async def _start(c: AdminClient, args: argparse.Namespace) -> str | int:
    if args.force and not args.reason.strip():
        raise UsageError("rollout start: --force needs a --reason")
    body: dict[str, Any] = {"force": args.force, "reason": args.reason}
    if args.steps is not None:
        body["steps"] = args.steps
    if args.min_step_s is not None:
        body["min_step_s"] = args.min_step_s
    return _out(args, await c.start_rollout(args.name, body))


async def _status(c: AdminClient, args: argparse.Namespace) -> str:
    return _out(args, await c.rollout())


def _action(kind: str) -> Any:
    async def act(c: AdminClient, args: argparse.Namespace) -> str:
        return _out(args, await c.rollout_action(kind, reason=args.reason))

    return act


def _options(p: argparse.ArgumentParser) -> None:
    add_admin_options(p, output=False)
    p.add_argument("--format", choices=("text", "json"), default="text")


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from exc
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = subparser(
        sub,
        "rollout",
        help="ramp a promoted candidate on live traffic; watch, pause, advance or abort it",
        description=(
            "After a promote verdict, send a growing share of NEW sessions to the candidate, "
            "step by step; each session keeps its side for life. The gateway advances a step "
            "when the live evidence is within the margins and the step's minimum time passed, "
            "rolls back on harm, and at 100 % completes: the candidate becomes live. Exit "
            "codes: 0 ok, 2 refused (verdict, bad input, a rollout already open, an invalid "
            "transition), 1 the API failed or is unreachable."
        ),
        examples=(
            "canary rollout start int8 --steps 1,5,25,50,100 --min-step-s 600",
            "canary rollout status",
            "canary rollout abort --reason 'pager: p99 up'",
        ),
    )
    cmds = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = subparser(
        cmds,
        "start",
        help="start ramping a candidate (needs a promote verdict, or --force --reason)",
        description=(
            "Start a rollout of the candidate at the first step. Refused unless its report's "
            "verdict is promote, or --force is given with a --reason (kept on the event)."
        ),
        examples=(
            "canary rollout start int8",
            "canary rollout start int8 --steps 5,50,100 --force --reason 'drill'",
        ),
    )
    p.add_argument("name", help="the candidate to ramp")
    p.add_argument(
        "--steps",
        type=_steps,
        metavar="P,P,...",
        help="percents of new sessions, strictly increasing, ending at 100 (default 1,5,25,50,100)",
    )
    p.add_argument(
        "--min-step-s",
        type=_non_negative,
        metavar="SECONDS",
        help="minimum time per step (default: the gateway's [rollout] default_min_step_s)",
    )
    p.add_argument("--force", action="store_true", help="ramp whatever the verdict says")
    p.add_argument("--reason", default="", help="why (kept with the rollout's events)")
    _options(p)
    p.set_defaults(func=lambda args: call_admin(args, _start))

    p = subparser(
        cmds,
        "status",
        help="the open rollout (else the last one) and its newest events",
        description="Show the open rollout, else the most recent one, with its newest events.",
        examples=("canary rollout status --format json",),
    )
    _options(p)
    p.set_defaults(func=lambda args: call_admin(args, _status))
    for kind, help_ in ACTIONS.items():
        p = subparser(
            cmds,
            kind,
            help=help_,
            description=help_[0].upper() + help_[1:] + ".",
            examples=(f"canary rollout {kind} --reason 'change 8812'",),
        )
        p.add_argument("--reason", default="", help="why (kept with the rollout's events)")
        _options(p)
        p.set_defaults(func=lambda args, kind=kind: call_admin(args, _action(kind)))
