"""Prometheus metric families: each declared once (name, type, help, label names), rendered here.

Every metric the gateway exports is a `Family`. The metrics registry
(`gateway.server.prometheus.Registry`) holds the live counters, gauges and histograms, and its
collectors yield the families they export and their `Sample`s; `render` writes the text format,
so a family's `# HELP` and `# TYPE` lines come from its one declaration and appear once. A
collector may also yield plain text lines another process rendered with `render` (the mirror
process's exposition relayed by each worker). Pure: no IO, nothing of ours imported, so
`storage` can declare its writer's families too.

With several workers on a host, each worker's own series carry a `worker` label
(`with_label`), and every worker serves the host's whole exposition: its own series, the other
workers' last rendered ones (relayed through the mirror process) and the mirror process's,
merged so that each family's header appears once (`merge`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram"]


def escape(value: str) -> str:
    """A label value in the text format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fmt(value: float) -> str:
    """A sample value: integers without a fraction, other floats in full."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def label_text(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{n}="{escape(v)}"' for n, v in zip(names, values, strict=True))


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family. `fmt` writes a sample's value (default: `fmt`)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    fmt: Callable[[float], str] = fmt

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def sample(self, value: float, *labels: str) -> Sample:
        if len(labels) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {labels}")
        return Sample(self, labels, value)

    def line(self, labels: Sequence[str], value: float) -> str:
        key: tuple[object, ...] = (self.name, self.labels, *labels)
        prefix = _PREFIXES.get(key)
        if prefix is None:
            text = label_text(self.labels, labels)
            prefix = f"{self.name}{{{text}}} " if text else f"{self.name} "
            if len(_PREFIXES) >= _PREFIXES_MAX:
                _PREFIXES.clear()
            _PREFIXES[key] = prefix
        return prefix + self.fmt(value)


# A series' name and escaped labels, kept: the same series are rendered at every scrape (and by
# the mirror process twice a second), and escaping their labels was half of rendering them.
# Bounded (cleared when full): label values come from configuration and counters' keys.
_PREFIXES: dict[tuple[object, ...], str] = {}
_PREFIXES_MAX = 4096


class Sample(NamedTuple):
    """One series' value of a family, at one scrape."""

    family: Family
    labels: tuple[str, ...]
    value: float


# What a collector yields: a family (its header, even with no samples yet), a sample, or a text
# line another process rendered with `render`.
Exposed = Family | Sample | str


def render(items: Iterable[Exposed], seen: set[str] | None = None) -> list[str]:
    """Text-format lines: each family's header once (before its first sample), then samples.

    `seen` carries the families already headed across several calls (one scrape)."""
    seen = set() if seen is None else seen
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
            continue
        family = item if isinstance(item, Family) else item.family
        if family.name not in seen:
            seen.add(family.name)
            out.extend(family.header())
        if isinstance(item, Sample):
            out.append(family.line(item.labels, item.value))
    return out


def six_digits(value: float) -> str:
    return f"{value:.6f}"


def three_digits(value: float) -> str:
    return f"{value:.3f}"


def significant(value: float) -> str:
    return f"{value:.6g}"


def integer(value: float) -> str:
    return str(int(value))


# --- the LLM grader of a model upgrade (gateway.mirror.grading.lane), per candidate ---------------

_GRADING_HELP = {
    "sampled": "Pairs selected for grading by the grader's rate.",
    "dropped": "Selected pairs not graded: queue full, an answer missing or failed, or late.",
    "calls": "Requests sent to the grader (an unparseable answer's retry is a second call).",
    "graded": "Gradings with a verdict (A, B or tie).",
    "tie": "Gradings whose verdict was a tie.",
    "unparseable": "Gradings whose answer was not the requested JSON object, after one retry.",
    "failed": "Gradings whose call failed (connection, timeout, non-200 status).",
    "over_cap": "Gradings not sent: max_per_minute or the daily token budget reached.",
    "tokens": "Prompt and completion tokens the grader reported.",
}
GRADING_FAMILIES: dict[str, Family] = {
    key: Family(f"canary_grading_{key}_total", "counter", text, ("candidate",))
    for key, text in _GRADING_HELP.items()
}


def with_label(lines: Iterable[str], name: str, value: str) -> list[str]:
    """`lines` (text format, as `render` writes them) with the label `name="value"` first on
    every sample; comment lines unchanged."""
    label = f'{name}="{escape(value)}"'
    out: list[str] = []
    for line in lines:
        if not line or line[0] == "#":
            out.append(line)
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            rest = line[brace + 1 :]
            sep = "" if rest.startswith("}") else ","
            out.append(f"{line[: brace + 1]}{label}{sep}{rest}")
        else:
            out.append(f"{line[:space]}{{{label}}}{line[space:]}")
    return out


def merge(texts: Iterable[Iterable[str]]) -> list[str]:
    """Several expositions as one: each family's `# HELP` and `# TYPE` once (the first text's),
    then its samples from every text, families in the order first seen. A sample belongs to
    the family whose header precedes it in its own text (a histogram's `_bucket`, `_sum` and
    `_count` lines included); other comment lines are kept, after the families."""
    heads: dict[str, dict[str, str]] = {}  # family -> {"HELP": line, "TYPE": line}
    samples: dict[str, list[str]] = {}
    rest: list[str] = []
    for lines in texts:
        family: str | None = None
        for line in lines:
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line[7:].split(" ", 1)[0]
                heads.setdefault(family, {}).setdefault(line[2:6], line)
                samples.setdefault(family, [])
            elif not line:
                continue
            elif line[0] != "#" and family is not None:
                samples[family].append(line)
            else:
                rest.append(line)  # a comment, or a sample before any header: kept, not lost
    out: list[str] = []
    for family, head in heads.items():
        out.extend(head[key] for key in ("HELP", "TYPE") if key in head)
        out.extend(samples[family])
    out.extend(rest)
    return out
