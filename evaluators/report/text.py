"""Plain-text (80 columns) and markdown renderings of a report.

Both read only the `Report` Struct, in the same order: verdict and one-line reasons first, then
the metric table (estimate, interval, n), the copy accounting, TTFT by turn, the load of each
arm, the diagnostic slices and the caveats.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Mapping, Sequence

from domain.accounting import SHED_WHEN_FIELDS
from evaluators.human.render import people_sections
from evaluators.judge.metric import MetricResult
from evaluators.judge.verdict import fmt, fmt_duration
from evaluators.pairs.gradings import (
    COMPLETE_PAIRS,
    PAIR_OUTCOME_LABELS,
    PAIR_OUTCOMES,
    accounting_key,
)
from evaluators.report.model import Report

WIDTH = 80
_ROLE = {"critical": " *", "guardrail": " +", "goal": " ^", "diagnostic": ""}


def _when(t: float | None) -> str:
    if t is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _num(v: object, spec: str = ",.0f") -> str:
    if v is None:
        return "–"
    if isinstance(v, int | float):
        return format(v, spec)
    return str(v)


def _interval(r: MetricResult) -> str:
    if (r.ci_low is None and r.ci_high is None) or r.status == "insufficient":
        return "–"
    return f"[{fmt(r, r.ci_low)}, {fmt(r, r.ci_high)}]"


def _estimate(r: MetricResult) -> str:
    return "–" if r.status == "insufficient" else fmt(r, r.estimate)


def _to_go(r: MetricResult) -> str:
    """The ETA of an undecided metric's pairs still needed, at the observed pair rate."""
    return f"≈{fmt_duration(r.eta_s)}" if r.eta_s is not None else "–"


def _table(header: Sequence[str], rows: list[list[str]], align: str) -> list[str]:
    """Fixed-width columns; `align` has one "<" or ">" per column."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if a == "<" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _token_sections(report: Report) -> list[tuple[str, list[str], list[list[str]], str]]:
    """How each arm's tokens were counted, and what that leaves gating."""
    out: list[tuple[str, list[str], list[list[str]], str]] = []
    if report.token_counts:
        rows = [
            [
                arm,
                str(c.get("counted_by") or "-"),
                _num(c.get("counted")),
                _num(c.get("not_counted")),
                _num(c.get("usage_minus_counted"), "+.2f"),
                _num(c.get("tokens_per_event"), ".2f"),
            ]
            for arm, c in report.token_counts.items()
        ]
        header = ["arm", "counted by", "counted", "not counted", "usage - counted", "tok/event"]
        title = "Token counting (one tokenizer for every arm; usage is information)"
        out.append((title, header, rows, "<<>>>>"))
    if report.token_metrics:  # why one does not gate is in its reason (and the JSON)
        rows = [[name, state.split(":")[0]] for name, state in report.token_metrics.items()]
        out.append(("Token metrics", ["metric", "state"], rows, "<<"))
    return out


def sections(report: Report) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, alignment) of every table, shared by text and markdown."""
    out: list[tuple[str, list[str], list[list[str]], str]] = []
    rows = [
        [r.label, _ROLE[r.role], _estimate(r), _interval(r), f"{r.n:,}", r.status]
        for r in report.metrics.values()
    ]
    header = ["metric", "role", "estimate", "interval", "n", "status"]
    title = "Metrics (role: * critical, + guardrail, ^ goal; intervals always-valid)"
    out.append((title, header, rows, "<<>>><"))
    rows = [
        [r.label, f"{r.more_pairs:,}", _to_go(r)]
        for r in report.metrics.values()
        if r.gating and r.status == "undecided" and r.more_pairs
    ]
    if rows:
        header = ["undecided metric", "pairs still needed", "ETA at the observed pair rate"]
        out.append(
            ("To decide (rough: extrapolates the interval's shrink rate)", header, rows, "<>>")
        )
    acc = report.accounting
    rows = [[name, f"{value:,}"] for name, value in acc.items() if name not in SHED_WHEN_FIELDS]
    out.append(("Copy accounting", ["counter", "copies"], rows, "<>"))
    rows = [
        [
            str(row["turn"]),
            _num(row.get("n")),
            _num(row.get("median_candidate_s"), ".3f"),
            _num(row.get("median_reference_s"), ".3f"),
            _num(row.get("ratio"), ".3f"),
            f"[{_num(row.get('ci_low'), '.3f')}, {_num(row.get('ci_high'), '.3f')}]",
            _num(row.get("cached_fraction_candidate"), ".0%"),
        ]
        for row in report.ttft_by_turn
        if row.get("n")  # a turn no pair reached says nothing (the HTML report skips it too)
    ]
    header = ["turn", "n", "cand s", "ref s", "ratio", "always-valid interval", "cached"]
    title = "TTFT by turn (medians; ratio as in the verdict; intervals always-valid)"
    out.append((title, header, rows, "<>>>>><"))
    rows = [
        [
            arm,
            _num(load.get("requests")),
            _num(load.get("requests_per_s"), ".2f"),
            _num(load.get("mean_concurrency"), ".1f"),
            _num(load.get("output_tokens_per_s"), ",.0f"),
            _num(load.get("median_decode_tps"), ",.0f"),
            _num(load.get("usd_per_1m_tokens_mirrored_load"), ",.2f"),
        ]
        for arm, load in report.arms_load.items()
    ]
    header = ["arm", "requests", "req/s", "in flight", "out tok/s", "decode tok/s", "$/1M tok"]
    out.append(("Load of each arm (mirrored load, not capacity)", header, rows, "<>>>>>>"))
    out += _token_sections(report)
    out.extend(_grader_sections(report))
    out.extend(people_sections(report))
    ttft = report.metrics.get("ttft")
    if ttft is not None and ttft.slices:
        rows = [
            [
                f"{s['slice']}={s['value']}",
                _num(s.get("n")),
                _num(s.get("ratio"), ".3f"),
                f"[{_num(s.get('ci_low'), '.3f')}, {_num(s.get('ci_high'), '.3f')}]",
                _num(s.get("q"), ".3g"),
            ]
            for s in ttft.slices
        ]
        header = ["slice", "n", "TTFT ratio", "always-valid interval", "adj. p"]
        out.append(("Diagnostic slices (not gating)", header, rows, "<>>><"))
    return out


def _grader_sections(report: Report) -> list[tuple[str, list[str], list[list[str]], str]]:
    """The LLM grader's tables (a model upgrade): what it said, its biases, what it cost."""
    pref = report.metrics.get("preference")
    if pref is None:
        return []
    d = pref.detail
    bias = report.metrics.get("grader_position_bias")
    aa = report.metrics.get("grader_aa")
    rows = [
        ["pairs graded", _num(d.get("pairs_graded"))],
        [
            "win / tie / loss (candidate)",
            " / ".join(_num(d.get(k), ".1%") for k in ("win_share", "tie_share", "loss_share")),
        ],
    ]
    if bias is not None and bias.estimate is not None:
        rows.append(
            [
                "position bias (first shown wins − ½)",
                f"{bias.estimate:+.1%} {_interval(bias)} over {bias.n:,} decisive verdicts",
            ]
        )
    rows.append(
        [
            "flip rate (pairs graded both ways)",
            f"{_num(d.get('flip_rate'), '.1%')} of {_num(d.get('pairs_both_orders'))}; decisive "
            f"flips {_num(d.get('decisive_flip_rate'), '.1%')}",
        ]
    )
    if d.get("length_controlled") is not None:
        rows.append(
            [
                "length-controlled net (not gating)",
                f"{_num(d.get('length_controlled'), '+.1%')} ± "
                f"{_num(d.get('length_controlled_se'), '.1%')} (fixed-sample SE); "
                f"{_num(d.get('length_slope_per_doubling'), '+.1%')} per doubling of length",
            ]
        )
    if aa is not None and aa.estimate is not None:
        rows.append(["grader A/A (control vs production)", f"{aa.estimate:+.1%} {_interval(aa)}"])
    rows.append(
        [
            "gradings: graded / unparseable / failed / over cap",
            " / ".join(
                _num(d.get(f"gradings_{k}"))
                for k in ("graded", "unparseable", "failed", "over_cap")
            ),
        ]
    )
    rows.append(
        [
            "grader tokens and cost",
            f"{_num(d.get('grader_tokens'))} tokens, ${_num(d.get('grader_cost_usd'), ',.2f')}",
        ]
    )
    out = [("LLM grader (a model upgrade judged by preference)", ["", ""], rows, "<<")]
    if (pairs := _grading_accounting(d)) is not None:
        out.append(pairs)
    if pref.slices:
        rows = [
            [str(x["slice"]), _num(x.get("n")), _num(x.get("estimate"), "+.1%")]
            for x in pref.slices
        ]
        out.append(
            (
                "Net preference by answer length (not gating)",
                ["bucket", "pairs", "net"],
                rows,
                "<>>",
            )
        )
    return out


def _grading_accounting(
    d: Mapping[str, object],
) -> tuple[str, list[str], list[list[str]], str] | None:
    """Every complete pair: graded, or not graded by reason; the rows add up to the total."""
    total = d.get(COMPLETE_PAIRS)
    if not isinstance(total, int):
        return None
    rows = []
    for outcome in PAIR_OUTCOMES:
        n = d.get(accounting_key(outcome), 0)
        if outcome == "graded" or n:
            share = n / total if total and isinstance(n, int) else None
            rows.append([PAIR_OUTCOME_LABELS[outcome], _num(n), _num(share, ".1%")])
    rows.append(["complete pairs (the sum)", _num(total), _num(1.0 if total else None, ".1%")])
    title = "Complete pairs: graded, or not graded by reason (every replica)"
    return (title, ["pairs", "n", "share"], rows, "<>>")


def head_lines(report: Report) -> list[str]:
    p = report.pairs
    ref = f"control ({p.control})" if p.control else "production"
    kind = f" ({report.kind})" if report.kind else ""
    return [
        f"canary report: {report.candidate}{kind}: {report.verdict.upper()}",
        report.reasons[0].reason if report.reasons else "",
        f"window {_when(p.window_start)} → {_when(p.window_end)}",
        f"reference {ref} · {p.n:,} pairs · {p.used_latency:,} usable · {p.lost:,} lost"
        + (" · planned look" if p.planned_look else ""),
    ] + (
        [
            f"{p.split_sessions:,} split sessions ({p.split_share:.1%} of the pairs) left out "
            "of the analysis by turn: see the caveats"
        ]
        if p.split_sessions
        else []
    )


def render_text(report: Report) -> str:
    """The report for an 80-column terminal."""
    lines: list[str] = []
    for line in head_lines(report):
        lines.extend(textwrap.wrap(line, WIDTH, subsequent_indent="  ") or [""])
    lines += ["", "WHY"]
    for reason in report.reasons[1:]:
        first = f"  {reason.metric:<18} {reason.status:<12} "
        lines.extend(
            textwrap.wrap(
                reason.reason,
                WIDTH,
                initial_indent=first,
                subsequent_indent=" " * len(first),
            )
        )
    for title, header, rows, align in sections(report):
        lines += ["", title.upper(), *_table(header, rows, align)]
    lines += ["", "CAVEATS"]
    for caveat in report.caveats:
        lines.extend(textwrap.wrap(caveat, WIDTH, initial_indent="- ", subsequent_indent="  "))
    notes = [(r.label, n) for r in report.metrics.values() for n in r.notes]
    if notes:
        lines += ["", "NOTES"]
        for label, note in notes:
            lines.extend(
                textwrap.wrap(
                    f"{label}: {note}", WIDTH, initial_indent="- ", subsequent_indent="  "
                )
            )
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured markdown."""
    head = head_lines(report)
    lines = [f"# {head[0]}", "", f"**{_md_escape(head[1])}**", "", head[2], "", head[3], ""]
    lines += ["## Why", "", "| metric | status | reason |", "|---|---|---|"]
    lines += [f"| {r.metric} | {r.status} | {_md_escape(r.reason)} |" for r in report.reasons[1:]]
    for title, header, rows, align in sections(report):
        lines += ["", f"## {title}", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---:" if a == ">" else "---" for a in align) + "|")
        lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    lines += ["", "## Caveats", ""]
    lines += [f"- {c}" for c in report.caveats]
    notes = [f"- **{r.label}**: {n}" for r in report.metrics.values() for n in r.notes]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"
