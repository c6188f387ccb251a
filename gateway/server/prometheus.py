"""A small, fast Prometheus text-format registry: counters, gauges and histograms.

Metrics are declared once with a fixed tuple of label names; `labels(...)` returns a child that
callers keep, so the hot path does one attribute increment and no allocation. There is no lock:
everything runs on one event loop per process (each worker process counts its own values).
Other parts (mirror, storage writer) export their own values through `add_collector`: a
collector yields the `domain.exposition.Family` declarations it exports and their samples, and
`render()` writes every family's HELP and TYPE from its declaration, once. No other module writes
a HELP or TYPE line (tests/server/test_metrics_exposition.py).

With `--workers N` (N > 1) each worker's exporter joins the host (`join_host`): its own series
carry `worker="<index>"`, and `render()` serves the host: this worker's series, the other
workers' last ones (relayed by the mirror process about once a second) and the lines collectors
relay, merged by family. `render_local()` is what this worker sends for the others to serve.

This module must never do IO, never format text outside `render()`, never block.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence

from domain.exposition import Exposed, Family, Kind, Sample, label_text, merge, render, with_label
from domain.exposition import fmt as _fmt

# Latency buckets in seconds: sub-millisecond proxy overhead up to very long generations.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

Collector = Callable[[], Iterable[Exposed]]
_label_text = label_text


class _Value:
    """One counter or gauge series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class _HistogramSeries:
    """One histogram series: per-bucket counts (cumulated only when rendered), sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class _Metric:
    kind: Kind

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str]) -> None:
        self.family = Family(name, self.kind, help_text, tuple(labelnames))
        self.name = name
        self.help = help_text
        self.labelnames = self.family.labels

    def header(self) -> list[str]:
        return self.family.header()

    def lines(self) -> list[str]:
        raise NotImplementedError


class _Scalar(_Metric):
    def __init__(self, name: str, help_text: str, labelnames: Sequence[str]) -> None:
        super().__init__(name, help_text, labelnames)
        self._series: dict[tuple[str, ...], _Value] = {}
        if not self.labelnames:
            self._series[()] = _Value()

    def labels(self, *values: str) -> _Value:
        """The series for these label values (created on first use); keep it, don't re-ask."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            series = self._series[values] = _Value()
        return series

    @property
    def value(self) -> float:
        """The unlabelled series' value."""
        return self._series[()].value

    def inc(self, amount: float = 1.0) -> None:
        self._series[()].value += amount

    def lines(self) -> list[str]:
        out = self.header()
        for values, series in sorted(self._series.items()):
            labels = _label_text(self.labelnames, values)
            out.append(
                f"{self.name}{{{labels}}} {_fmt(series.value)}"
                if labels
                else f"{self.name} {_fmt(series.value)}"
            )
        return out


class Counter(_Scalar):
    """A monotonically increasing count."""

    kind = "counter"


class Gauge(_Scalar):
    """A value that goes up and down (in-flight requests, queue depth)."""

    kind = "gauge"

    def dec(self, amount: float = 1.0) -> None:
        self._series[()].value -= amount

    def set(self, value: float) -> None:
        self._series[()].value = value


class Histogram(_Metric):
    """A distribution over fixed buckets (upper bounds, inclusive)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labelnames)
        self.bounds = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], _HistogramSeries] = {}
        if not self.labelnames:
            self._series[()] = _HistogramSeries(self.bounds)

    def labels(self, *values: str) -> _HistogramSeries:
        """The series for these label values (created on first use); keep it, don't re-ask."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            series = self._series[values] = _HistogramSeries(self.bounds)
        return series

    def observe(self, value: float) -> None:
        self._series[()].observe(value)

    def lines(self) -> list[str]:
        out = self.header()
        les = [_fmt(b) for b in self.bounds] + ["+Inf"]
        for values, series in sorted(self._series.items()):
            labels = _label_text(self.labelnames, values)
            prefix = labels + "," if labels else ""
            running = 0
            for le, count in zip(les, series.counts, strict=True):
                running += count
                out.append(f'{self.name}_bucket{{{prefix}le="{le}"}} {running}')
            suffix = f"{{{labels}}}" if labels else ""
            out.append(f"{self.name}_sum{suffix} {_fmt(series.sum)}")
            out.append(f"{self.name}_count{suffix} {series.count}")
        return out


class Exporter:
    """Holds metrics in declaration order and renders them all as Prometheus text."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []
        # One of several workers (`join_host`): its label value, and the other workers' last
        # rendered text by label value; None: a single process, no label.
        self._host: tuple[str, Callable[[], Mapping[str, str]]] | None = None

    def join_host(self, worker: str, peers: Callable[[], Mapping[str, str]]) -> None:
        """Make this the exporter of worker `worker` of several: its own series carry
        `worker="<worker>"`, and `render` adds the others' (`peers()`: label value -> their
        last `render_local` text). Called once, when the hand-off that relays them exists."""
        self._host = (worker, peers)

    def _add(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help_text, labelnames)
        self._add(metric)
        return metric

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help_text, labelnames)
        self._add(metric)
        return metric

    def histogram(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        metric = Histogram(name, help_text, labelnames, buckets)
        self._add(metric)
        return metric

    def get(self, name: str) -> _Metric | None:
        return self._metrics.get(name)

    def add_collector(self, fn: Collector) -> None:
        """`fn()` yields, at each scrape, the families it exports and their samples."""
        self._collectors.append(fn)

    def families(self) -> list[Family]:
        """Every family this registry exports: its metrics' declarations and those its
        collectors yield (text another process rendered is not a declaration: left out)."""
        out = [metric.family for metric in self._metrics.values()]
        for fn in self._collectors:
            for item in fn():
                if isinstance(item, Family):
                    out.append(item)
                elif isinstance(item, Sample):
                    out.append(item.family)
        return out

    def _lines(self) -> tuple[list[str], list[str]]:
        """(this process's own lines, the lines its collectors relay from another process)."""
        own: list[str] = []
        relayed: list[str] = []
        for metric in self._metrics.values():
            own.extend(metric.lines())
        seen = set(self._metrics)
        for fn in self._collectors:
            try:
                items = list(fn())
                own.extend(render((i for i in items if not isinstance(i, str)), seen))
                relayed.extend(i for i in items if isinstance(i, str))
            except Exception as exc:  # one broken exporter must not hide every other metric
                own.append(f"# collector {getattr(fn, '__name__', fn)!s} failed: {exc!r}")
        return own, relayed

    def render_local(self) -> str:
        """This process's own series (with its `worker` label, if any): what a worker sends the
        mirror process for the other workers to serve."""
        own, _ = self._lines()
        if self._host is not None:
            own = with_label(own, "worker", self._host[0])
        return "\n".join(own)

    def render(self) -> str:
        own, relayed = self._lines()
        if self._host is None:
            lines = own + relayed
        else:
            worker, peers = self._host
            texts = [with_label(own, "worker", worker)]
            texts.extend(text.split("\n") for name, text in peers().items() if name != worker)
            lines = merge([*texts, relayed])
        lines.append("")
        return "\n".join(lines)
