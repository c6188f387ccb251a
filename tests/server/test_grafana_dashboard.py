"""The Grafana dashboard (deploy/grafana/canary-gateway.json) queries only what the gateway
exports: every metric name, every label matcher, grouping label and legend label of every
PromQL expression, and every literal label value it matches, is checked against the families a
running gateway with a candidate declares and serves on /metrics. A renamed metric, label or
outcome fails here instead of leaving an empty panel."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import gateway
import storage
from domain.exposition import Family
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from tests.waiting import IMPORTS_S, until

DASHBOARD = Path(__file__).parents[2] / "deploy/grafana/canary-gateway.json"
TOKEN = "grafana-test-token-0c4e9a1f"
MODEL = "sim-model"
# Labels Prometheus adds to every series it scrapes (the target's), not the gateway's.
TARGET_LABELS = frozenset({"instance", "job"})
KEYWORDS = frozenset(
    "by without on ignoring group_left group_right bool offset and or unless".split()
)
AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile".split()
)
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[[^\]]*\]|\{[^}]*\}|[A-Za-z_:][A-Za-z0-9_:]*|\S')
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)"')
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:\\.|[^"\\])*)"')


@dataclass
class Query:
    """What one PromQL expression refers to."""

    selectors: list[tuple[str, list[tuple[str, str, str]]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def parse_promql(expr: str) -> Query:
    """Metric selectors (name and label matchers) and grouping labels of an expression: enough
    PromQL for dashboards (functions, aggregations with by/without, binary operators)."""
    tokens = _TOKEN.findall(expr)
    out = Query()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok in KEYWORDS:
            if tok in ("by", "without", "on", "ignoring") and nxt == "(":
                j = i + 2
                while tokens[j] != ")":
                    if tokens[j] != ",":
                        out.grouping.add(tokens[j])
                    j += 1
                i = j
        elif tok in AGGREGATIONS and nxt in ("by", "without"):
            pass  # `sum by (...) (...)`: the grouping comes next
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) and nxt != "(":
            matchers = _MATCHER.findall(nxt) if nxt.startswith("{") else []
            out.selectors.append((tok, matchers))
        i += 1
    return out


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    """(where, expression, legend) for every panel target and template variable."""
    doc = json.loads(DASHBOARD.read_text())

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(doc["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", "")
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["definition"])
            assert m, var["definition"]
            yield f"variable ${var['name']}", f'{m[1]}{{{m[2]}=~".*"}}', ""


@dataclass
class Exported:
    """Families by name: declared label names, and label values seen on /metrics."""

    kinds: dict[str, str] = field(default_factory=dict)
    labels: dict[str, set[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def add(self, family: Family) -> None:
        self.kinds[family.name] = family.kind
        self.labels.setdefault(family.name, set()).update(family.labels)

    def family_of(self, name: str) -> tuple[str, set[str]] | None:
        """(family, label names) for a series name (histograms: _bucket, _sum, _count)."""
        if name in self.labels and self.kinds.get(name) != "histogram":
            return name, self.labels[name]
        for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
            base = name.removesuffix(suffix)
            if base != name and self.kinds.get(base) == "histogram":
                return base, self.labels[base] | extra
        return None


def _declared_families() -> Iterator[Family]:
    """Every module-level Family of the gateway and storage packages (also inside tuples,
    lists and dicts): the mirror process's and the writer's declarations."""

    def walk(value: object, depth: int = 0) -> Iterator[Family]:
        if isinstance(value, Family):
            yield value
        elif depth < 3 and isinstance(value, tuple | list):
            for v in value:
                yield from walk(v, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for v in value.values():
                yield from walk(v, depth + 1)

    for pkg in (gateway, storage):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith(".__main__"):  # runs the CLI when imported
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                yield from walk(value)


async def _scrape_running_gateway(tmp: Path) -> tuple[str, list[Family]]:
    """/metrics of a running gateway with one candidate after a few mirrored requests, and the
    families its worker registry declares."""
    fast = {"time_scale": 0.02, "served_model_names": (MODEL,)}
    live = await start_sim(get_profile("baseline", **fast))
    cand = await start_sim(get_profile("bi-kv", **fast))
    try:
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": live.url,
                "db_url": f"sqlite+aiosqlite:///{tmp / 'g.db'}",
                "admin_token": f"ops:{TOKEN}",
                "candidates": [
                    {"name": "cand", "url": cand.url, "sample_rate": 1.0, "target_rps": 5.0}
                ],
            },
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            for i in range(3):
                chat = {"model": MODEL, "messages": [{"role": "user", "content": f"Hi {i}"}]}
                async with http.post(f"{parts.url}/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
                    await r.read()
            text = ""

            async def observed() -> bool:  # the mirror process's counters, at idle priority
                # One more request a look: the candidate's `target_rps` controller samples
                # nothing until it has measured production's rate, so the first few requests
                # may go unmirrored.
                nonlocal text
                async with http.post(f"{parts.url}/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
                    await r.read()
                async with http.get(f"{parts.url}/metrics") as resp:
                    text = await resp.text()
                return (
                    re.search(r'copies_total\{candidate="cand",outcome="observed_ok"\} [1-9]', text)
                    is not None
                )

            with contextlib.suppress(AssertionError):  # the caller's checks say what is missing
                await until(observed, what="a copy observed", within_s=IMPORTS_S, every_s=0.1)
            return text, parts.metrics.families()
    finally:
        await cand.close()
        await live.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    text, registry = asyncio.run(_scrape_running_gateway(tmp_path_factory.mktemp("grafana")))
    out = Exported()
    for family in (*registry, *_declared_families()):
        out.add(family)
    kind_of = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for line in text.splitlines():
        if not (m := _SAMPLE.match(line)):
            continue
        found = out.family_of(m[1])
        if found is None:  # relayed from the mirror process: its TYPE line says the kind
            out.kinds.setdefault(m[1], kind_of.get(m[1], "untyped"))
            out.labels.setdefault(m[1], set())
            found = (m[1], out.labels[m[1]])
        for label, value in _LABEL.findall(m[2] or ""):
            out.labels[found[0]].add(label)
            out.values.setdefault((found[0], label), set()).add(value)
    assert "canary_mirror_process_info" in out.labels  # the mirror process's families are in
    return out


def _literals(op: str, value: str) -> list[str] | None:
    """The values an = or a plain alternation =~ matcher names; None for real regexes and
    dashboard variables (nothing to check against)."""
    if "$" in value or op in ("!=", "!~"):
        return None
    if op == "=":
        return [value]
    if re.fullmatch(r"[A-Za-z0-9_/]+(\|[A-Za-z0-9_/]+)*", value):
        return value.split("|")
    return None


def test_dashboard_queries_only_what_the_gateway_exports(exported: Exported) -> None:
    problems: list[str] = []
    queries = list(dashboard_queries())
    assert len(queries) >= 30
    for where, expr, legend in queries:
        q = parse_promql(expr)
        assert q.selectors, f"{where}: no metric in {expr}"
        known: set[str] = set(TARGET_LABELS)
        for name, matchers in q.selectors:
            found = exported.family_of(name)
            if found is None:
                problems.append(f"{where}: {name} is not exported")
                continue
            family, labels = found
            known |= labels
            for label, op, value in matchers:
                if label not in labels | TARGET_LABELS:
                    problems.append(f"{where}: {name} has no label {label!r}")
                    continue
                seen = exported.values.get((family, label)) or set()
                problems.extend(
                    f"{where}: {name}{{{label}}} never takes {literal!r}"
                    for literal in _literals(op, value) or []
                    if seen and literal not in seen
                )
        problems.extend(
            f"{where}: grouping label {label!r} is on none of its metrics"
            for label in q.grouping - known
        )
        legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        problems.extend(
            f"{where}: legend label {label!r} is on none of its metrics"
            for label in legend_labels - known - q.grouping
        )
    assert not problems, "\n".join(problems)


def test_dashboard_covers_what_operators_watch() -> None:
    """Production latency and errors, copies by outcome, shedding and drops with reasons,
    buffers and the memory budget, the mirror process's CPU and priority, split sessions, and
    the ramp: weight, state, requests by arm and outcome, fallbacks and rollbacks by reason; a
    model upgrade's grader: gradings by outcome, tokens."""
    exprs = " ".join(expr for _, expr, _ in dashboard_queries())
    for needed in (
        "canary_proxy_ttft_seconds_bucket",
        "canary_proxy_e2e_seconds_bucket",
        'status=~"5.."',
        "canary_proxy_upstream_errors_total",
        "sum by (candidate, outcome) (rate(canary_mirror_copies_total",
        "sum by (reason) (rate(canary_mirror_shed_total",
        "canary_mirror_handoff_dropped_total",
        "canary_mirror_skipped_total",
        "canary_mirror_memory_bytes",
        "canary_mirror_memory_budget_bytes",
        "canary_mirror_buffer_bytes",
        "canary_mirror_cpu_busy",
        "priority) (canary_mirror_process_info",
        "max by (replica) (increase(canary_mirror_split_sessions_total",
        "canary_rollout_weight",
        "state) (canary_rollout_state",
        "sum by (arm, outcome) (rate(canary_rollout_requests_total",
        "sum by (reason) (rate(canary_rollout_fallbacks_total",
        "sum by (reason) (increase(canary_rollout_rollbacks_total",
        "rate(canary_grading_unparseable_total",
        "rate(canary_grading_over_cap_total",
        "increase(canary_grading_tokens_total",
    ):
        assert needed in exprs, needed


def test_parser_finds_names_matchers_and_grouping() -> None:
    """The checker's own parser on an expression of every shape the dashboard uses."""
    q = parse_promql(
        'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{x="1",y=~"b|c"}[5m])))'
        ' / on (route) group_left sum without (z) (b_total{w!="$v"}) and c'
    )
    assert q.selectors == [
        ("a_bucket", [("x", "=", "1"), ("y", "=~", "b|c")]),
        ("b_total", [("w", "!=", "$v")]),
        ("c", []),
    ]
    assert q.grouping == {"le", "route", "z"}
