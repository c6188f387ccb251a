"""`canary label NAME`: a person labels a model upgrade's graded pairs in a terminal, blind,
through the labelling API of a running gateway (docs/grading.md, People check the grader).

Each pair is printed as plain text wrapped to the terminal (the conversation, then answers A
and B in the order the API drew; control characters escaped), with the rubric the grader was
given and the progress against the candidate's target; one letter and Enter answers: a, b, t
(tie), s (skip), u (undo the last label), q (quit). The token is the usual CLI token
(`CANARY_ADMIN_TOKEN`): a labeller token may label and nothing else. Never prints which answer
is whose, nor the grader's verdict: the API does not say, and the `order` it sends goes back
with the label only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from domain.errors import EXIT_OK
from gateway.cli.commands.candidates import add_admin_options, call_admin, subparser

if TYPE_CHECKING:
    from gateway.cli.client import AdminClient

KEYS = {"a": "A", "b": "B", "t": "tie", "s": "skip"}
PROMPT = "[a] A better  [b] B better  [t] tie  [s] skip  [u] undo  [q] quit > "
# A terminal narrower than this still gets lines of this width (a word per line helps nobody).
MIN_WIDTH = 40


def wrapped(text: str, width: int, indent: str = "  ") -> str:
    """`text` as a terminal shows it safely: control characters escaped, each of its lines
    wrapped to `width` and indented (its own line breaks kept)."""
    from gateway.cli.escape import terminal_safe

    out: list[str] = []
    for line in terminal_safe(text).expandtabs(4).splitlines() or [""]:
        out += textwrap.wrap(
            line,
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_long_words=True,
            break_on_hyphens=False,
        ) or [indent.rstrip()]
    return "\n".join(out)


def progress_line(progress: dict[str, Any], target: int | None) -> str:
    """The progress as the live page states it: labelled pairs against the target."""
    done = int(progress.get("labelled_pairs", 0))
    goal = (
        f"{done:,} pairs labelled of the target {target:,} ({min(done / target, 1.0):.0%})"
        if target
        else f"{done:,} pairs labelled (no target set: min_labels)"
    )
    return (
        f"progress: {goal}; {int(progress.get('kept', 0)):,} kept for people, "
        f"{int(progress.get('skips', 0)):,} skipped; yours {int(progress.get('mine', 0)):,}"
    )


def pair_text(pair: dict[str, Any], width: int) -> str:
    rule = "-" * min(width, 79)
    return "\n".join(
        [
            rule,
            "Conversation:",
            wrapped(str(pair["conversation"]), width),
            "",
            "Answer A:",
            wrapped(str(pair["answer_a"]), width),
            "",
            "Answer B:",
            wrapped(str(pair["answer_b"]), width),
            rule,
        ]
    )


async def _label(
    c: AdminClient,
    args: argparse.Namespace,
    read: Callable[[], str] = sys.stdin.readline,
    say: Callable[[str], None] = print,
) -> int:
    from gateway.cli.escape import terminal_safe

    width = max(shutil.get_terminal_size((80, 24)).columns - 1, MIN_WIDTH)
    name = args.name
    first = await c.label_next(name)  # an unknown candidate, a refused token: exit 2 here
    say(f"labelling the pairs of {terminal_safe(name)}: which answer serves the user better?")
    say(wrapped(str(first.get("rubric", "")), width))
    offer: dict[str, Any] | None = first
    shown: dict[str, Any] | None = None
    done: list[dict[str, Any]] = []  # the pairs labelled here: undo shows the undone one again
    while True:
        offer = offer if offer is not None else await c.label_next(name)
        pair = shown or offer.get("pair")
        say(wrapped(progress_line(offer.get("progress") or {}, offer.get("target")), width, ""))
        if pair is None:
            say("no pair is waiting for you: every pair kept for people is labelled")
            break
        say(pair_text(pair, width))
        key = ""
        while key not in (*KEYS, "u", "q"):
            sys.stdout.write(PROMPT)
            sys.stdout.flush()
            line = read()
            if not line:  # end of input: as q
                key = "q"
                break
            key = line.strip().lower()
            if key not in (*KEYS, "u", "q"):
                say(f"{terminal_safe(key)!r} is not an answer: type one of a, b, t, s, u or q")
        if key == "q":
            break
        offer, shown = None, None
        if key == "u":
            status, undone = await c.label_undo(name)
            if status != 200:
                say(f"refused: {_refusal(status, undone)}")
                continue
            again = [p for p in done if p["exchange_id"] == undone["undone"]]
            shown = again[0] if again else None
            done = [p for p in done if p is not shown]
            say("undone: your last label" + (": label this pair again" if shown else ""))
            continue
        body = {"exchange_id": pair["exchange_id"], "order": pair["order"], "answer": KEYS[key]}
        status, stored = await c.label(name, body)
        if status != 201:
            # Labelled already, or the pair gone: say why and go on (nothing was stored).
            say(f"refused: {_refusal(status, stored)}")
            continue
        done.append(pair)
        say("skipped" if key == "s" else f"stored: {KEYS[key]}")
    n = len(done)
    say(f"{n} label{'s' if n != 1 else ''} stored in this session")
    return EXIT_OK


def _refusal(status: int, body: dict[str, Any]) -> str:
    """The API's message of a refusal the session goes on after; a candidate deleted meanwhile
    ends it (AdminAPIError: exit 2, the CLI edge says why)."""
    from gateway.cli.client import AdminAPIError
    from gateway.cli.escape import one_line

    error = body.get("error")
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message", f"HTTP {status}"))
    if error.get("field") == "candidate":
        raise AdminAPIError(status, message)
    return one_line(message)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = subparser(
        sub,
        "label",
        help="label a model upgrade's graded pairs in the terminal (people check the grader)",
        description=(
            "Label the pairs a model upgrade's grader graded, blind, as the live page's "
            "labelling view does: the conversation and two answers A and B in a random order, "
            "as plain text; type a (A is better), b (B is better), t (tie), s (skip), u (undo "
            "your last label) or q (quit), then Enter. Each label is stored before the next "
            "pair shows. Which answer is the candidate's and what the grader said are never "
            "shown. The token comes from CANARY_ADMIN_TOKEN: a labeller token (admin."
            "labeller_token) may label and nothing else. Exit codes: 0 done or quit, 2 refused "
            "(unknown candidate, storage.store_text off, a token that may not label, bad "
            "--admin-url), 1 the API failed or is unreachable."
        ),
        examples=(
            "canary label upgrade --admin-url http://gateway:8080",
            "CANARY_ADMIN_TOKEN=ann:$TOKEN canary label upgrade",
        ),
    )
    p.add_argument(
        "name", help="the candidate (a model upgrade with a grader) whose pairs to label"
    )
    add_admin_options(p, output=False)
    p.set_defaults(func=lambda args: call_admin(args, _label))
