"""Text, JSON and HTML renderings of a capacity result (HTML: one self-contained page with SVG
plots of goodput and latency against offered load, drawn with evaluators.report.svg's axes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

import msgspec

from evaluators.capacity.estimate import ArmEstimate, CapacityResult
from evaluators.report import svg


def to_json(result: CapacityResult) -> str:
    return msgspec.json.format(msgspec.json.encode(result).decode(), indent=2)


def _f(value: float | None, fmt: str = ".3g", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _interval(lo: float | None, hi: float | None, fmt: str = ".3g") -> str:
    return "" if lo is None or hi is None else f" [{lo:{fmt}}, {hi:{fmt}}]"


def _arm_line(a: ArmEstimate, unit: str, confidence: float) -> str:
    if a.capacity_load is None:
        cap = "below the lowest load"
    else:
        bound = "≥ " if a.broke_at is None else ""
        load_ci = _interval(a.capacity_load_low, a.capacity_load_high, "d")
        cap = (
            f"{bound}{_f(a.capacity)} good req/s{_interval(a.capacity_low, a.capacity_high)} "
            f"at {a.capacity_load} {unit}{load_ci}"
        )
    cost = f", ${_f(a.usd_per_1m_tokens, '.4g')}/1M output tokens" if a.usd_per_1m_tokens else ""
    return f"  {a.arm:9} {a.endpoint}: {cap}{cost}  ({confidence:.0%} intervals)"


def render_text(result: CapacityResult) -> str:
    r = result
    lines = [
        f"capacity at SLO {r.slo} (a step passes when ≥ {r.attainment:.0%} of requests meet it)",
        f"offered load: concurrent {r.load_unit}; {r.driven}",
        _arm_line(r.candidate, r.load_unit, r.confidence),
        _arm_line(r.reference, r.load_unit, r.confidence),
    ]
    if r.ratio is not None:
        ci = _interval(r.ratio_low, r.ratio_high)
        lines.append(f"  capacity ratio candidate/reference: {r.ratio:.3g}{ci}")
    lines.extend(f"  note: {n}" for n in r.notes)
    head = (
        f"{'arm':9} {'load':>4} {'req':>5} {'err':>4} {'SLO%':>5} {'goodput':>8} {'tok/s':>8} "
        f"{'ttft p50':>8} {'p99':>7} {'tpot p50':>8} {'p99':>7} {'iev p50':>7} {'e2e p99':>8} "
        f"{'pfx hit':>7}"
    )
    lines += ["", "per step (latencies in ms):", head]
    for a in (r.candidate, r.reference):
        for s in a.steps:
            hit = "-" if s.prefix_cache_hit_rate is None else f"{s.prefix_cache_hit_rate:.0%}"
            lines.append(
                f"{a.arm:9} {s.load:>4} {s.requests:>5} {s.errors:>4} {s.attainment:>5.0%} "
                f"{s.goodput:>8.2f} {s.output_tokens_per_s:>8.1f} {_ms(s.ttft_s['p50']):>8} "
                f"{_ms(s.ttft_s['p99']):>7} {_ms(s.tpot_s['p50']):>8} {_ms(s.tpot_s['p99']):>7} "
                f"{_ms(s.inter_event_s.get('p50')):>7} {_ms(s.e2e_s['p99']):>8} {hit:>7}"
            )
    return "\n".join(lines) + "\n"


def load_chart(
    title: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], y_label: str
) -> str:
    """Lines of y against offered load, one per series (name -> (loads, values))."""
    xs = [x for loads, _ in series.values() for x in loads]
    ys = [y for _, values in series.values() for y in values if math.isfinite(y)]
    if not xs or not ys:
        return svg._frame(title + " (no data)", [])
    x_lo, x_hi = min(xs), max(xs)
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    y_hi = max(ys) * 1.1 or 1.0
    body, sx, sy = svg._axes((x_lo, x_hi), (0.0, y_hi), ("offered load", y_label))
    for i, (name, (loads, values)) in enumerate(series.items()):
        pairs = [(x, y) for x, y in zip(loads, values, strict=True) if math.isfinite(y)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pairs)
        body.append(
            f'<polyline points="{pts}" fill="none" stroke="{svg.color(name, i)}" stroke-width="2"/>'
        )
        body.extend(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{svg.color(name, i)}"/>'
            for x, y in pairs
        )
        body.append(svg._legend(i, name, svg.color(name, i)))
    return svg._frame(title, body)


Series = dict[str, tuple[list[float], list[float]]]


def _series(result: CapacityResult, pick: str, sub: str | None = None) -> Series:
    """Per arm: (loads, values) of one step statistic (`sub`: a percentile, shown in ms)."""
    out: Series = {}
    for a in (result.candidate, result.reference):
        xs: list[float] = []
        ys: list[float] = []
        for s in a.steps:
            value = getattr(s, pick)
            if sub is not None:
                value = value.get(sub)
            if value is not None:
                xs.append(float(s.load))
                ys.append(float(value) * (1000.0 if sub else 1.0))
        out[a.arm] = (xs, ys)
    return out


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:2em;max-width:1200px}"
    "svg{margin:4px;border:1px solid #ddd}svg text{font-size:11px}svg .t{font-size:13px}"
    "svg .a{stroke:#333}pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
)


def render_html(result: CapacityResult) -> str:
    charts = [
        load_chart("goodput (requests meeting the SLO / s)", _series(result, "goodput"), "req/s"),
        load_chart("output tokens per second", _series(result, "output_tokens_per_s"), "tokens/s"),
        load_chart("TTFT p90 (ms)", _series(result, "ttft_s", "p90"), "ms"),
        load_chart("TPOT p90 (ms)", _series(result, "tpot_s", "p90"), "ms"),
        load_chart("E2E p90 (ms)", _series(result, "e2e_s", "p90"), "ms"),
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>capacity: "
        f"{escape(result.candidate.endpoint)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Capacity of {escape(result.candidate.endpoint)} vs "
        f"{escape(result.reference.endpoint)}</h1>"
        f"<pre>{escape(render_text(result))}</pre>" + "".join(charts) + "</body></html>\n"
    )
