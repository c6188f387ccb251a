"""Tiny inline-SVG charts for the HTML report: lines (CDFs), intervals, paired bars.

No JavaScript, no external CSS or fonts: each function returns one `<svg>` element as text,
sized in CSS pixels, so the report stays a single self-contained file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

W, H = 560, 260
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 28, 40
COLORS = {"production": "#555555", "candidate": "#d9480f", "control": "#1c7ed6"}
_FALLBACK = ("#2b8a3e", "#862e9c", "#e67700")
Scale = Callable[[float], float]


def color(name: str, i: int = 0) -> str:
    return COLORS.get(name, _FALLBACK[i % len(_FALLBACK)])


def _frame(title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">'
        f'<text x="{W / 2}" y="16" text-anchor="middle" class="t">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        out = [10.0**e * m for e in range(a, b + 1) for m in (1, 2, 5)]
        return [t for t in out if lo <= t <= hi] or [lo, hi]
    span = max(hi - lo, 1e-12)
    base = 10 ** math.floor(math.log10(span / 5))
    step = next(base * m for m in (1, 2, 5, 10) if span / (base * m) <= 6)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _axes(
    x: tuple[float, float],
    y: tuple[float, float],
    labels: tuple[str, str],
    *,
    log_x: bool = False,
    x_ticks: bool = True,
    y_fmt: str = "g",
) -> tuple[list[str], Scale, Scale]:
    """Axis lines, labels and ticks; returns them with the data-to-pixel scales."""
    (x_lo, x_hi), (y_lo, y_hi) = x, y

    def sx(v: float) -> float:
        if log_x:
            frac = (math.log(v) - math.log(x_lo)) / (math.log(x_hi) - math.log(x_lo))
        else:
            frac = (v - x_lo) / (x_hi - x_lo) if x_hi > x_lo else 0.5
        return PAD_L + frac * (W - PAD_L - PAD_R)

    def sy(v: float) -> float:
        frac = (v - y_lo) / (y_hi - y_lo) if y_hi > y_lo else 0.5
        return H - PAD_B - frac * (H - PAD_T - PAD_B)

    mid_y = (PAD_T + H - PAD_B) / 2
    body = [
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="a"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="a"/>',
        f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 6}" text-anchor="middle">'
        f"{escape(labels[0])}</text>",
        f'<text x="12" y="{mid_y}" text-anchor="middle" transform="rotate(-90 12 {mid_y})">'
        f"{escape(labels[1])}</text>",
    ]
    if x_ticks:
        body.extend(
            f'<text x="{sx(t):.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{t:g}</text>'
            for t in _ticks(x_lo, x_hi, log_x)
        )
    body.extend(
        f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:{y_fmt}}</text>'
        for t in _ticks(y_lo, y_hi, False)
    )
    return body, sx, sy


def cdf_chart(title: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> str:
    """Empirical CDFs: series name -> (values at each percentile, percentiles 0..100)."""
    xs = [x for values, _ in series.values() for x in values if x > 0 and math.isfinite(x)]
    if not xs:
        return _frame(title + " (no data)", [])
    lo, hi = min(xs), max(xs)
    log_x = hi / lo > 20
    if hi <= lo:
        hi = lo * 1.1
    body, sx, sy = _axes((lo, hi), (0.0, 100.0), ("seconds", "percentile"), log_x=log_x)
    for i, (name, (values, levels)) in enumerate(series.items()):
        pts = " ".join(
            f"{sx(x):.1f},{sy(p):.1f}"
            for x, p in zip(values, levels, strict=True)
            if x > 0 and math.isfinite(x)
        )
        body.append(
            f'<polyline points="{pts}" fill="none" stroke="{color(name, i)}" stroke-width="2"/>'
        )
        body.append(_legend(i, name, color(name, i)))
    return _frame(title, body)


def _legend(i: int, name: str, fill: str) -> str:
    x, y = PAD_L + 10 + 110 * i, PAD_T + 4
    return (
        f'<rect x="{x}" y="{y}" width="10" height="10" fill="{fill}"/>'
        f'<text x="{x + 14}" y="{y + 9}">{escape(name)}</text>'
    )


def interval_chart(
    title: str,
    labels: Sequence[str],
    est: Sequence[float],
    lo: Sequence[float],
    hi: Sequence[float],
    ref: float = 1.0,
    y_label: str = "ratio",
) -> str:
    """Point estimates with interval bars per label, and a dashed reference line."""
    vals = [v for v in (*est, *lo, *hi, ref) if math.isfinite(v)]
    if not labels or not vals:
        return _frame(title + " (no data)", [])
    y_lo, y_hi = min(vals), max(vals)
    margin = 0.1 * (y_hi - y_lo or 0.1)
    y_lo, y_hi = y_lo - margin, y_hi + margin
    n = len(labels)
    span = (0.0, float(n))
    body, _, sy = _axes(span, (y_lo, y_hi), ("", y_label), x_ticks=False, y_fmt=".3g")
    ry = sy(ref)
    body.append(f'<line x1="{PAD_L}" y1="{ry:.1f}" x2="{W - PAD_R}" y2="{ry:.1f}" class="r"/>')
    step = (W - PAD_L - PAD_R) / n
    for i, label in enumerate(labels):
        x = PAD_L + step * (i + 0.5)
        body.append(
            f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{escape(label)}</text>'
        )
        if math.isfinite(lo[i]) and math.isfinite(hi[i]):
            body.append(
                f'<line x1="{x:.1f}" y1="{sy(lo[i]):.1f}" x2="{x:.1f}" '
                f'y2="{sy(hi[i]):.1f}" stroke="#d9480f" stroke-width="2"/>'
            )
        if math.isfinite(est[i]):
            body.append(f'<circle cx="{x:.1f}" cy="{sy(est[i]):.1f}" r="4" fill="#d9480f"/>')
    return _frame(title, body)


def paired_bars(
    title: str,
    labels: Sequence[str],
    a: Sequence[float],
    b: Sequence[float],
    names: tuple[str, str],
) -> str:
    """Two bars per label (e.g. candidate vs noise floor), values in [0, 1] shown as %."""
    if not labels:
        return _frame(title + " (no data)", [])
    top = max([0.01, *(v for v in (*a, *b) if math.isfinite(v))]) * 1.15
    body, _, sy = _axes((0.0, 1.0), (0.0, top * 100), ("", "% of pairs"), x_ticks=False)
    step = (W - PAD_L - PAD_R) / len(labels)
    bar = step * 0.3
    for i, label in enumerate(labels):
        x0 = PAD_L + step * i + step * 0.2
        for j, (v, fill) in enumerate(((a[i], "#d9480f"), (b[i], "#1c7ed6"))):
            if not math.isfinite(v):
                continue
            y = sy(v * 100)
            body.append(
                f'<rect x="{x0 + j * bar:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{H - PAD_B - y:.1f}" fill="{fill}"/>'
            )
        body.append(
            f'<text x="{x0 + bar:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    body.append(_legend(0, names[0], "#d9480f"))
    body.append(_legend(1, names[1], "#1c7ed6"))
    return _frame(title, body)


def trajectory_chart(
    title: str,
    points: Sequence[Sequence[float | None]],
    lines: Mapping[str, float],
    *,
    y_fmt: str = "g",
) -> str:
    """An always-valid interval against pairs: `points` are [pairs, low, high]; `lines` are
    horizontal references (the margin, the goal, no change) by label."""
    pts = [
        (float(p[0] or 0), float(p[1]), float(p[2]))
        for p in points
        if p[1] is not None and p[2] is not None and math.isfinite(p[1]) and math.isfinite(p[2])
    ]
    if len(pts) < 2:
        return _frame(title + " (too few looks)", [])
    values = [v for _, lo, hi in pts for v in (lo, hi)] + list(lines.values())
    # The first looks' intervals can be very wide: clip the axis to 3 × the spread of the rest.
    ref = [*lines.values(), pts[-1][1], pts[-1][2]]
    span = max(ref) - min(ref) or abs(ref[0]) or 1.0
    y_lo = max(min(values), min(ref) - 3 * span)
    y_hi = min(max(values), max(ref) + 3 * span)
    body, sx, sy = _axes(
        (pts[0][0], pts[-1][0]), (y_lo, y_hi), ("pairs", "always-valid interval"), y_fmt=y_fmt
    )

    def clip(v: float) -> float:
        return sy(min(max(v, y_lo), y_hi))

    band = [f"{sx(x):.1f},{clip(hi):.1f}" for x, _, hi in pts]
    band += [f"{sx(x):.1f},{clip(lo):.1f}" for x, lo, _ in reversed(pts)]
    body.append(f'<polygon points="{" ".join(band)}" fill="#d9480f" fill-opacity="0.25"/>')
    for i, (label, value) in enumerate(lines.items()):
        if y_lo <= value <= y_hi:
            y = sy(value)
            body.append(
                f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" '
                f'stroke="{_FALLBACK[i % len(_FALLBACK)]}" stroke-dasharray="5 3"/>'
                f'<text x="{W - PAD_R - 2}" y="{y - 3:.1f}" text-anchor="end">'
                f"{escape(label)}</text>"
            )
    return _frame(title, body)
