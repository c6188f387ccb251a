"""One self-contained HTML page: the text report's sections as tables, plus inline SVG plots.

Plots: latency CDFs per arm (TTFT, E2E), TTFT ratio by turn with intervals, each gating
metric's always-valid interval against pairs with its margin (the decision coming), and
agreement metrics against the production-vs-control noise floor. No scripts, no external resources.
"""

from __future__ import annotations

import math
import time
from html import escape

from evaluators.judge.metric import MetricResult
from evaluators.metrics.quality import AGREEMENT
from evaluators.metrics.throughput import CDF_LEVELS
from evaluators.report import svg
from evaluators.report.model import Report
from evaluators.report.text import head_lines, sections

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
h1{font-size:1.4em;margin-bottom:.2em}h2{font-size:1.1em;margin-top:1.6em}
.v{display:inline-block;padding:.1em .6em;border-radius:.3em;color:#fff;font-weight:600}
.promote{background:#2b8a3e}.hold{background:#e67700}.reject{background:#c92a2a}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:.15em .7em;border-bottom:1px solid #ddd}
th{text-align:left}td.r{text-align:right;font-variant-numeric:tabular-nums}
.s-critical,.s-beyond{color:#c92a2a;font-weight:600}.s-inside,.s-improved,.s-ok{color:#2b8a3e}
.s-undecided,.s-insufficient{color:#e67700}.muted{color:#777}
svg{margin:.5em 1em .5em 0;border:1px solid #eee}svg text{font:11px sans-serif;fill:#333}
svg .t{font-weight:600;font-size:12px}svg .a{stroke:#999}svg .r{stroke:#999;stroke-dasharray:4 3}
"""


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan


def _lines(m: MetricResult) -> dict[str, float]:
    """The horizontal references of a metric's trajectory plot: its margins and no change."""
    out: dict[str, float] = {"no change": 1.0 if m.scale == "ratio" else 0.0}
    if m.goal is not None:
        out["goal"] = m.goal
    for label, value in (("margin", m.margin), ("critical", m.critical_margin)):
        if value is None:
            continue
        if m.harm in ("higher", "both"):
            out[label] = value
        if m.harm in ("lower", "both"):
            out[label + " (low)"] = 1 / value if m.scale == "ratio" else -value
    return out


def _plots(report: Report) -> list[str]:
    out = []
    for field, label in (("ttft_cdf", "TTFT"), ("e2e_cdf", "E2E")):
        series: dict[str, tuple[list[float], list[float]]] = {}
        for arm, load in report.arms_load.items():
            values = load.get(field)
            if isinstance(values, list):
                series[arm] = (values, [float(x) for x in CDF_LEVELS])
        out.append(svg.cdf_chart(f"{label} CDF per arm", series))
    rows = [r for r in report.ttft_by_turn if r.get("n")]
    out.append(
        svg.interval_chart(
            "TTFT ratio by turn (candidate / reference)",
            [f"turn {r['turn']}" for r in rows],
            [_num(r.get("ratio")) for r in rows],
            [_num(r.get("ci_low")) for r in rows],
            [_num(r.get("ci_high")) for r in rows],
        )
    )
    out.extend(
        svg.trajectory_chart(f"{m.label}: interval against pairs", m.trajectory, _lines(m))
        for m in report.metrics.values()
        if m.gating and len(m.trajectory) >= 2
    )
    agree = [
        m
        for m in report.metrics.values()
        if (m.name in AGREEMENT or m.name == "logprob_divergence") and m.n
    ]
    out.append(
        svg.paired_bars(
            "Disagreement with production: candidate vs "
            + ("noise floor (control)" if report.pairs.control else "production"),
            [m.name for m in agree],
            [_num(m.detail.get("rate_candidate")) for m in agree],
            [_num(m.detail.get("rate_reference")) for m in agree],
            ("candidate", "noise floor" if report.pairs.control else "production"),
        )
    )
    return out


def render_html(report: Report) -> str:
    """The report as one HTML document."""
    head = head_lines(report)
    title = f"canary report: {report.candidate}"
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f'<h1>{escape(title)} <span class="v {report.verdict}">{report.verdict}</span></h1>',
        f"<p><strong>{escape(head[1])}</strong></p>",
        f'<p class="muted">{escape(head[2])}<br>{escape(head[3])}</p>',
        "<h2>Why</h2><table><tr><th>metric</th><th>status</th><th>reason</th></tr>",
    ]
    parts += [
        f"<tr><td>{escape(r.metric)}</td><td class=s-{escape(r.status.replace('/', ''))}>"
        f"{escape(r.status)}</td><td>{escape(r.reason)}</td></tr>"
        for r in report.reasons[1:]
    ]
    parts.append("</table><h2>Plots</h2>")
    parts += _plots(report)
    for title_, header, rows, align in sections(report):
        parts.append(f"<h2>{escape(title_)}</h2><table><tr>")
        parts += [f"<th>{escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            cells = [
                f"<td{' class=r' if a == '>' else ''}>{escape(c)}</td>"
                for c, a in zip(row, align, strict=True)
            ]
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    parts.append("<h2>Caveats</h2><ul>")
    parts += [f"<li>{escape(c)}</li>" for c in report.caveats]
    parts.append("</ul>")
    notes = [(m.label, n) for m in report.metrics.values() for n in m.notes]
    if notes:
        parts.append("<h2>Notes</h2><ul>")
        parts += [f"<li><strong>{escape(a)}</strong>: {escape(b)}</li>" for a, b in notes]
        parts.append("</ul>")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.generated_at))
    parts.append(f'<p class="muted">generated {stamp} · schema {report.schema_version}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
