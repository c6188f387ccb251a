"""`canary promote NAME` and `canary rollback`, through the admin API of a running gateway.

A promote is refused (exit 2, the verdict and its reasons on stderr) unless the candidate's
latest report says `promote` or `--force` is given; either way the decision, its author (the
token's label) and the report are written to the promotions audit log.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gateway.cli.commands.candidates import add_admin_options, call_admin, dump_json, subparser

if TYPE_CHECKING:
    from gateway.cli.client import AdminClient
    from gateway.control.admin.schema import PromotionResult


def _text(result: PromotionResult) -> str:
    p = result.promotion
    if p.action == "promote":
        lines = [f"promoted {p.to_endpoint}: it is now the live endpoint"]
        if p.from_endpoint:
            lines.append(f"{p.from_endpoint} is retired (`canary rollback` restores it)")
        forced = " (forced)" if p.forced else ""
        lines.append(f"verdict {p.verdict or 'unavailable'}{forced}; by {p.actor}; audit #{p.id}")
    else:
        lines = [f"rolled back: {p.to_endpoint} is the live endpoint again"]
        if p.from_endpoint:
            lines.append(f"{p.from_endpoint} is retired")
        lines.append(f"by {p.actor}; audit #{p.id}")
    if p.reason:
        lines.append(f"reason: {p.reason}")
    return "\n".join(lines)


async def _promote(c: AdminClient, args: argparse.Namespace) -> str:
    result = await c.promote(args.name, reason=args.reason, force=args.force)
    return dump_json(result) if args.format == "json" else _text(result)


async def _rollback(c: AdminClient, args: argparse.Namespace) -> str:
    result = await c.rollback(reason=args.reason)
    return dump_json(result) if args.format == "json" else _text(result)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = subparser(
        sub,
        "promote",
        help="make a candidate the live endpoint (needs a promote verdict or --force)",
        description=(
            "Make a candidate the live endpoint, atomically; the old live endpoint is kept as "
            "'retired' so `canary rollback` can restore it. Refused unless the candidate's "
            "report verdict is 'promote' or --force is given. Exit codes: 0 promoted, 2 "
            "refused (verdict, unknown name, lost a race), 1 the API failed or is unreachable."
        ),
        examples=(
            "canary promote int8 --reason 'p99 TTFT -18%, quality unchanged'",
            "canary promote int8 --force --reason 'incident 4711: live is down'",
        ),
    )
    p.add_argument("name", help="the candidate to promote")
    p.add_argument("--force", action="store_true", help="promote whatever the verdict says")
    p.add_argument("--reason", default="", help="why (kept in the audit log)")
    add_admin_options(p)
    p.set_defaults(func=lambda args: call_admin(args, _promote))

    r = subparser(
        sub,
        "rollback",
        help="restore the previous live endpoint",
        description=(
            "Undo the newest promotion not undone yet: the endpoint it replaced becomes live "
            "again and the current one is retired. Repeated rollbacks step back through the "
            "history. Exit codes: 0 done, 2 nothing to roll back to, 1 the API failed or is "
            "unreachable."
        ),
        examples=("canary rollback --reason 'error rate up after the promote'",),
    )
    r.add_argument("--reason", default="", help="why (kept in the audit log)")
    add_admin_options(r)
    r.set_defaults(func=lambda args: call_admin(args, _rollback))
