"""`canary candidates add|list|show|update|pause|resume|remove`: the registry, through the
admin API of a running gateway.

Also home of what the admin-API commands share (`promote` and `rollback` use it): the
`--admin-url` / `--format` options, the bearer token from `CANARY_ADMIN_TOKEN` (a client-side
credential, read here and never printed), the exit codes (0 ok, 2 the API refused the input,
1 the API failed or could not be reached) and 80-column tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import shutil
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from domain.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from gateway.cli.client import AdminClient
    from gateway.control.admin.schema import CandidateDetail, EndpointView, RateView

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
TOKEN_ENV = "CANARY_ADMIN_TOKEN"
Action = Callable[["AdminClient", argparse.Namespace], Coroutine[Any, Any, Any]]


def add_admin_options(p: argparse.ArgumentParser, *, output: bool = True) -> None:
    p.add_argument(
        "--admin-url",
        default=DEFAULT_ADMIN_URL,
        metavar="URL",
        help=f"the gateway's base URL (default {DEFAULT_ADMIN_URL}); token from ${TOKEN_ENV}",
    )
    if output:
        p.add_argument("--format", choices=("table", "json"), default="table")


def subparser(
    sub: argparse._SubParsersAction[Any],
    name: str,
    *,
    help: str,
    description: str,
    examples: Sequence[str],
) -> argparse.ArgumentParser:
    """A subcommand parser whose help wraps at 79 columns and ends with examples."""
    import textwrap

    head = "example:" if len(examples) == 1 else "examples:"
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, 79),
        epilog="\n".join([head, *(f"  {e}" for e in examples)]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def _token() -> str | None:
    from gateway.config.load import parse_admin_tokens

    tokens = parse_admin_tokens(os.environ.get(TOKEN_ENV))
    return next(iter(tokens), None)  # `label:token,...`: the first one


def call_admin(args: argparse.Namespace, action: Action) -> int:
    """Run `action(client, args)` and print its result (an int is the exit code); what it
    raises is the CLI edge's to map (`gateway.cli.errors.cli_errors`)."""
    from gateway.cli.client import AdminClient
    from gateway.cli.escape import terminal_safe
    from gateway.config.load import check_http_url

    if reason := check_http_url(args.admin_url):
        raise UsageError(f"--admin-url {args.admin_url!r}: {reason}")
    token = _token()

    async def go() -> Any:
        async with AdminClient(args.admin_url, token, token_source=TOKEN_ENV) as client:
            return await action(client, args)

    out = asyncio.run(go())
    if isinstance(out, int):
        return out
    if out is not None:
        print(terminal_safe(str(out)))  # stored strings predate today's validation, maybe
    return EXIT_OK


def dump_json(obj: object) -> str:
    import msgspec

    return msgspec.json.format(msgspec.json.encode(obj), indent=2).decode()


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], flex: int = -1, align: str = ""
) -> str:
    """Columns as wide as their content, left-aligned unless `align` has a ">" at the column's
    index; column `flex` is cut (with …) so lines fit the terminal."""
    width = max(shutil.get_terminal_size((80, 24)).columns, 40)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    flex %= len(headers)
    fixed = sum(w + 2 for i, w in enumerate(widths) if i != flex)
    widths[flex] = max(min(widths[flex], width - fixed), len(headers[flex]))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            w = widths[i]
            cell = cell if len(cell) <= w else cell[: w - 1] + "…"
            out.append(cell.rjust(w) if align[i : i + 1] == ">" else cell.ljust(w))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the unit the loop stops at is the answer
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}".replace(".0 ", " ")


def _opt(value: object) -> str:
    return "-" if value is None or value == {} or value == "" else str(value)


def _sampling(ep: EndpointView) -> str:
    if ep.target_rps is None:
        return f"{ep.sample_rate:g} of traffic, by {ep.sampling}"
    return f"{ep.target_rps:g} copies/s, at most {ep.sample_rate:g} of traffic, by {ep.sampling}"


def _per_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}/s"


def rate_rows(r: RateView) -> list[tuple[str, str]]:
    """The realized rate: copies/s, the share in force, the host's traffic, and (with a
    target) how often the share changed and what that cost conversations."""
    if r.effective_sample_rate is None:
        return [("realized", "not measured yet (the host's mirror process reports it)")]
    rows = [
        (
            "realized",
            f"{_per_s(r.realized_copies_per_second)} copies, a share of "
            f"{r.effective_sample_rate:.4g} of {_per_s(r.eligible_requests_per_second)} "
            "requests",
        )
    ]
    if r.target_rps is not None:
        cost = f", {r.sessions_cut} sessions cut, {r.sessions_joined} joined mid-way"
        rows.append(
            (
                "rate changes",
                f"{r.rate_changes}{cost if r.sessions_cut or r.sessions_joined else ''}",
            )
        )
    return rows


def endpoint_rows(ep: EndpointView) -> list[tuple[str, str]]:
    verdict = ", ".join(f"{k}={v:g}" for k, v in sorted(ep.verdict.items()))
    creds = f"${ep.credentials_env} (the variable's name)" if ep.credentials_env else "-"
    return [
        ("name", ep.name),
        ("role", ep.role),
        ("state", ep.state),
        ("url", ep.url),
        ("kind", _opt(ep.kind)),
        ("model", _opt(ep.model)),
        ("sampling", _sampling(ep)),
        ("buffer", f"{ep.buffer_max_items} items, {_size(ep.buffer_max_bytes)}"),
        ("concurrency", str(ep.concurrency)),
        ("timeout", f"{ep.timeout_s:g} s"),
        ("price", "-" if ep.price_per_hour_usd is None else f"${ep.price_per_hour_usd:g}/h"),
        ("gpus", str(ep.gpus)),
        ("credentials", creds),
        ("forward auth", "yes" if ep.forward_auth else "no"),
        ("verdict", _opt(verdict)),
        ("grader", _grader(ep)),
        *((f.replace("_", " "), _opt(getattr(ep, f))) for f in _plain_fields()),
        ("version", str(ep.version)),
    ]


# The fields endpoint_rows renders its own way (or not at all); any other field of the
# declaration is shown as it is, so a new one appears without touching this module.
_RENDERED = frozenset(
    {
        "name", "role", "state", "url", "kind", "model", "sample_rate", "target_rps",
        "sampling", "buffer_max_items", "buffer_max_bytes", "concurrency", "timeout_s",
        "price_per_hour_usd", "gpus", "credentials_env", "forward_auth", "verdict", "version",
        "created_at", "updated_at", "grader",
    }
)  # fmt: skip


def _grader(ep: EndpointView) -> str:
    """The grader in one line: model at URL, rates, cap, budget, price, credentials' name."""
    g = ep.grader
    if g is None:
        return "-"
    creds = f", ${g.credentials_env}" if g.credentials_env else ""
    prompt = ", custom prompt" if g.prompt else ""
    return (
        f"{g.model} at {g.url}: rate {g.rate:g}, swap {g.swap_rate:g}, "
        f"<= {g.max_per_minute}/min, <= {g.daily_token_budget:,} tokens/day, "
        f"${g.price_per_mtok:g}/Mtok{creds}{prompt}"
    )


def _plain_fields() -> tuple[str, ...]:
    from domain.endpoint import Endpoint  # not the detail's counters, buffer and rate

    return tuple(f for f in Endpoint.__struct_fields__ if f not in _RENDERED)


def show_text(ep: CandidateDetail) -> str:
    rows = endpoint_rows(ep)
    b = ep.buffer
    rows.insert(
        8,
        (
            "buffer fill",
            f"{b.items}/{b.max_items} items, {_size(b.bytes)}/{_size(b.max_bytes)} "
            f"({b.fill_ratio:.1%})",
        ),
    )
    rows[7:7] = rate_rows(ep.rate)
    out = [f"{k:<14}{v}" for k, v in rows]
    out.append("")
    out.append("counters (this gateway replica)")
    import msgspec

    items = list(msgspec.structs.asdict(ep.counters).items())
    for i in range(0, len(items), 2):
        pair = items[i : i + 2]
        out.append("  " + "    ".join(f"{k:<18}{v:>12}" for k, v in pair))
    return "\n".join(out)


def list_text(eps: Sequence[EndpointView], rates: dict[str, RateView] | None = None) -> str:
    """One row per endpoint: RATE is the share (`sample_rate`) or, for a candidate with
    `target_rps`, the copies/s it asks for; REALIZED the copies/s this host samples now."""
    if not eps:
        return "no candidates (add one: canary candidates add NAME URL)"
    rates = rates or {}
    rows = [
        (
            e.name,
            e.role,
            e.state,
            f"{e.sample_rate:g}" if e.target_rps is None else f"{e.target_rps:g}/s",
            _per_s(r.realized_copies_per_second) if (r := rates.get(e.name)) else "-",
            e.sampling,
            _opt(e.kind),
            e.url,
        )
        for e in eps
    ]
    headers = ("NAME", "ROLE", "STATE", "RATE", "REALIZED", "SAMPLING", "KIND", "URL")
    return table(headers, rows)


# --- actions ----------------------------------------------------------------------------------

# The fields `candidates add|update` take as flags, one per field of
# `domain.endpoint.CandidateSpec` (type, bounds, choices and help from its declaration), but those
# with their own commands or arguments (name and url are positional, --url on update; state:
# pause/resume and --paused; verdict overrides: the repeatable --verdict KEY=VALUE; the grader:
# --grader with its JSON object, or off).
_FLAG_EXCLUDED = frozenset({"name", "url", "state", "verdict", "grader"})


def _add_fields() -> tuple[str, ...]:
    from domain.endpoint import CandidateSpec

    return tuple(f for f in CandidateSpec.__struct_fields__ if f not in _FLAG_EXCLUDED)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body = {f: v for f in _add_fields() if (v := getattr(args, f)) is not None}
    for f, v in body.items():
        if v == _OFF:  # `--target-rps off`: cleared (target_rps: back to the fixed sample_rate)
            body[f] = None
    for extra in ("url", "role"):
        if getattr(args, extra, None) is not None:
            body[extra] = getattr(args, extra)
    if args.verdict:
        body["verdict"] = dict(args.verdict)
    if args.grader is not None:
        body["grader"] = None if args.grader == _OFF else args.grader
    if getattr(args, "paused", False):
        body["state"] = "paused"
    return body


def _fmt(args: argparse.Namespace, obj: Any, text: str) -> str:
    return dump_json(obj) if args.format == "json" else text


async def _add(c: AdminClient, args: argparse.Namespace) -> str:
    ep = await c.create_candidate({"name": args.name, **_body(args)})
    return _fmt(args, ep, "\n".join(f"{k:<14}{v}" for k, v in endpoint_rows(ep)))


async def _update(c: AdminClient, args: argparse.Namespace) -> str:
    ep = await c.update_candidate(args.name, _body(args))
    return _fmt(args, ep, "\n".join(f"{k:<14}{v}" for k, v in endpoint_rows(ep)))


async def _list(c: AdminClient, args: argparse.Namespace) -> str:
    listed = await c.list_candidates()
    return _fmt(args, listed, list_text(listed.candidates, listed.rates))


async def _show(c: AdminClient, args: argparse.Namespace) -> str:
    ep = await c.get_candidate(args.name)
    return _fmt(args, ep, show_text(ep))


def _set_state(state: str) -> Action:
    async def act(c: AdminClient, args: argparse.Namespace) -> str:
        ep = await c.update_candidate(args.name, {"state": state})
        return _fmt(args, ep, f"{ep.name}: {ep.state}")

    return act


async def _remove(c: AdminClient, args: argparse.Namespace) -> str:
    await c.delete_candidate(args.name)
    return _fmt(args, {"removed": args.name}, f"removed {args.name}")


# --- parsers ----------------------------------------------------------------------------------


def _grader_object(text: str) -> object:
    """`--grader`: a JSON object of the grader's fields (checked by the admin API, which names
    a bad field), or `off` to remove the grader."""
    if text.strip().lower() == _OFF:
        return _OFF
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JSON object or off, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object or off, got {text!r}")
    return value


def _verdict_pair(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


_OFF = "off"


def _bounds(t: Any) -> str:
    """`> 0 and <= 1e+06`: the numeric bounds of a msgspec IntType/FloatType."""
    ops = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
    return " and ".join(f"{op} {v:g}" for key, op in ops if (v := getattr(t, key)) is not None)


def _number(field: str, t: Any, unit: str, nullable: bool) -> Callable[[str], object]:
    """The parser of a numeric flag: a number within the field's declared bounds (nan and inf
    refused), or `off` for a nullable field (the request then clears it)."""
    import msgspec.inspect

    kind = int if isinstance(t, msgspec.inspect.IntType) else float

    def parse(text: str) -> object:
        if nullable and text.strip().lower() in (_OFF, "none"):
            return _OFF
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {unit}, got {text!r}") from None
        tests = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}
        bounded = [test(value, b) for k, test in tests.items() if (b := getattr(t, k)) is not None]
        if value != value or not all(bounded):  # nan passes no bound
            raise argparse.ArgumentTypeError(
                f"{field} must be {_bounds(t) or 'a number'}, got {text!r}"
            )
        return value

    return parse


def _field_options(p: argparse.ArgumentParser) -> None:
    """One flag per declared candidate field (see _FLAG_EXCLUDED), then --verdict."""
    import msgspec.inspect

    from domain.endpoint import CandidateSpec

    mi = msgspec.inspect
    info = mi.type_info(CandidateSpec)
    assert isinstance(info, mi.StructType)
    g = p.add_argument_group("candidate settings (omitted ones keep their default or value)")
    for f in info.fields:
        if f.name in _FLAG_EXCLUDED:
            continue
        t, nullable = f.type, False
        if isinstance(t, mi.UnionType):
            (t,) = [m for m in t.types if not isinstance(m, mi.NoneType)]
            nullable = True
        extra: dict[str, Any] = {}
        help_ = ""
        if isinstance(t, mi.Metadata):
            extra = dict(t.extra or {})
            help_ = (t.extra_json_schema or {}).get("description", "")
            t = t.type
        flag = "--" + f.name.replace("_", "-")
        opts: dict[str, Any] = {"help": help_ or None}
        if isinstance(t, mi.BoolType):
            opts.update(action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(t, mi.LiteralType):
            opts.update(choices=t.values)
        elif isinstance(t, mi.IntType | mi.FloatType):
            metavar = extra.get("metavar", "N" if isinstance(t, mi.IntType) else "NUMBER")
            unit = extra.get("unit", "an integer" if isinstance(t, mi.IntType) else "a number")
            opts.update(
                type=_number(f.name, t, unit, nullable),
                metavar=metavar + ("|off" if nullable else ""),
            )
        else:
            opts.update(metavar=extra.get("metavar", f.name.upper()))
        g.add_argument(flag, **opts)
    g.add_argument(
        "--verdict",
        type=_verdict_pair,
        action="append",
        metavar="KEY=VALUE",
        help="verdict setting override (repeatable), e.g. --verdict min_pairs=500",
    )
    g.add_argument(
        "--grader",
        type=_grader_object,
        metavar="JSON|off",
        help="LLM grader of a model upgrade (docs/grading.md), e.g. "
        '\'{"url": "http://judge:8000", "model": "judge-7b", "price_per_mtok": 0.2}\'',
    )


def _cmd(
    sub: argparse._SubParsersAction[Any],
    name: str,
    help_: str,
    examples: Sequence[str],
    action: Action,
) -> argparse.ArgumentParser:
    p = subparser(sub, name, help=help_, description=help_ + ".", examples=examples)
    add_admin_options(p)
    p.set_defaults(func=lambda args: call_admin(args, action))
    return p


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = subparser(
        sub,
        "candidates",
        help="register, list, inspect, pause and remove candidates (via the admin API)",
        description=(
            "Manage the candidate endpoints of a running gateway through its admin API "
            f"(--admin-url); the bearer token is read from ${TOKEN_ENV}. Exit codes: 0 ok, "
            "2 the API refused the request (bad input, unknown name, conflict), 1 the API "
            "failed or could not be reached."
        ),
        examples=(
            "canary candidates add int8 http://10.0.0.7:8000 --kind quantized",
            "canary candidates list --admin-url http://gateway:8080",
            "canary candidates show int8 --format json",
        ),
    )
    cmds = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = _cmd(
        cmds,
        "add",
        "register a candidate; mirroring to it starts at once",
        (
            "canary candidates add int8 http://10.0.0.7:8000 --sample-rate 0.2",
            "canary candidates add replica http://10.0.0.9:8000 --target-rps 20",
            "canary candidates add bi-kv https://bikv.internal:8443 --kind bi-kv \\\n"
            "      --sampling session --credentials-env BIKV_API_KEY",
        ),
        _add,
    )
    p.add_argument("name", help="unique name: lowercase letters, digits, - and _")
    p.add_argument("url", help="base URL of the candidate (http or https)")
    p.add_argument("--paused", action="store_true", help="register it paused (no mirroring)")
    _field_options(p)
    p = _cmd(
        cmds,
        "update",
        "change settings of a candidate",
        ("canary candidates update bi-kv --sample-rate 0.5 --concurrency 8",),
        _update,
    )
    p.add_argument("name")
    p.add_argument("--url", help="new base URL")
    p.add_argument(
        "--role",
        choices=("candidate", "retired"),
        help="retire it, or bring a retired endpoint back as a candidate",
    )
    _field_options(p)
    _cmd(cmds, "list", "list candidates and retired endpoints", ("canary candidates list",), _list)
    for name, help_, action in (
        ("show", "show a candidate's settings, counters and buffer fill", _show),
        ("pause", "stop mirroring to a candidate (its data is kept)", _set_state("paused")),
        ("resume", "resume mirroring to a paused candidate", _set_state("active")),
        ("remove", "remove a candidate (never the live endpoint)", _remove),
    ):
        _cmd(cmds, name, help_, (f"canary candidates {name} bi-kv",), action).add_argument("name")
