"""/metrics is one registry's text format: every family declared once, each with exactly one
HELP and one TYPE line, its samples together and well formed.

A complete gateway (worker, mirror process, admin API, capture on) runs in front of simulated
engines on 127.0.0.1:0, mirrors a request to a candidate, and its whole /metrics answer is
parsed by the Prometheus text-format rules below. The source is scanned too: no module but
domain/exposition.py writes a HELP or TYPE line.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import aiohttp

from domain.exposition import Family, merge, render, with_label
from gateway.config.load import load_config
from gateway.process.runtime import running
from gateway.server.prometheus import Histogram
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from tests.waiting import IMPORTS_S, until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-metrics-3b9e"
MODEL = "m"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})? (?P<value>\S+)$"
)
_HELP = re.compile(rf"^# HELP (?P<name>{_NAME}) (?P<text>.+)$")
_TYPE = re.compile(rf"^# TYPE (?P<name>{_NAME}) (?P<kind>counter|gauge|histogram|summary|untyped)$")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def parse_exposition(text: str) -> dict[str, dict[str, object]]:
    """Check `text` against the text-format rules; return each family's kind, help and series.

    Rules: lines are HELP, TYPE or samples (no other comment, no blank line but the final
    newline); a family has one HELP then one TYPE, before its samples; a family's samples are
    contiguous and name it (histograms: _bucket/_sum/_count, with `le` on buckets); no series
    twice; values are floats; counters end in _total; histogram buckets are cumulative."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, dict[str, object]] = {}
    current: str | None = None
    closed: set[str] = set()
    series: set[str] = set()
    pending_help: str | None = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n}: {line!r}"
        if m := _HELP.match(line):
            name = m["name"]
            assert name not in families and pending_help is None, f"second HELP, {where}"
            pending_help = name
            families[name] = {"help": m["text"], "kind": None, "series": []}
            if current is not None:
                closed.add(current)
            current = None
            continue
        if m := _TYPE.match(line):
            name = m["name"]
            assert pending_help == name, f"TYPE without its HELP just before, {where}"
            assert families[name]["kind"] is None, f"second TYPE, {where}"
            families[name]["kind"] = m["kind"]
            pending_help, current = None, name
            continue
        assert not line.startswith("#"), f"stray comment, {where}"
        m = _SAMPLE.match(line)
        assert m is not None, f"malformed sample, {where}"
        assert current is not None and current not in closed, f"sample outside its block, {where}"
        kind = families[current]["kind"]
        suffix = m["name"].removeprefix(current)
        assert m["name"].startswith(current) and suffix in _SUFFIXES.get(str(kind), ("",)), where
        value = float(m["value"])  # raises on a malformed value
        assert not math.isnan(value) or kind == "gauge", where
        key = f"{m['name']}{{{m['labels'] or ''}}}"
        assert key not in series, f"series twice, {where}"
        series.add(key)
        labels = dict(
            re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m["labels"] or "")
        )
        if suffix == "_bucket":
            assert "le" in labels, where
        families[current]["series"].append((m["name"], labels, value))  # type: ignore[attr-defined]
    assert pending_help is None, "a HELP without its TYPE at the end"
    for name, fam in families.items():
        assert fam["kind"] is not None, f"{name}: no TYPE"
        if fam["kind"] == "counter":
            assert name.endswith("_total"), f"counter {name} does not end in _total"
        if fam["kind"] == "histogram":
            _check_buckets(name, fam["series"])  # type: ignore[arg-type]
    return families


def _check_buckets(name: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
    runs: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for sample, labels, value in samples:
        if sample.endswith("_bucket"):
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            runs.setdefault(key, []).append(value)
    for key, counts in runs.items():
        assert counts == sorted(counts), f"{name}{dict(key)}: buckets not cumulative"


def test_the_parser_refuses_what_prometheus_refuses() -> None:
    """The checker is strict: each broken exposition below fails it."""
    good = [*render([Family("a_total", "counter", "A.", ("k",)).sample(1, "x")]), ""]
    parse_exposition("\n".join(good))
    broken = [
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n# HELP a_total A.\n",
        "# TYPE a_total counter\na_total 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n",
        "# HELP a_total A.\n# TYPE a_total counter\nb_total 1\n",
        '# HELP a_total A.\n# TYPE a_total counter\na_total{k="x} 1\n',
        "# HELP a A.\n# TYPE a counter\na 1\n",
        "# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\na 2\n",
        "# HELP a A.\n# TYPE a gauge\na one\n",
    ]
    for text in broken:
        try:
            parse_exposition(text)
        except (AssertionError, ValueError):
            continue
        raise AssertionError(f"accepted: {text!r}")


def test_several_workers_expositions_merge_into_one_valid_exposition() -> None:
    """Each worker's own lines labelled `worker`, merged with the others' and a relayed text:
    every family headed once with all of its samples, none lost, a histogram's lines kept in
    its block; labels go first, also on a series without labels."""
    reqs = Family("r_total", "counter", "R.", ("route",))
    up = Family("up", "gauge", "Up.")
    hist = Histogram("h_seconds", "H.", ("route",), (0.1, 1.0))
    hist.labels("/a").observe(0.5)
    mirror = render([Family("m_total", "counter", "M.").sample(7)])

    def worker(i: int) -> list[str]:
        own = render([reqs.sample(i + 1, "/a"), reqs.sample(10 * i, "/b"), up.sample(1)])
        return with_label([*own, *hist.lines()], "worker", str(i))

    merged = merge([worker(0), worker(1), worker(2), mirror])
    families = parse_exposition("\n".join([*merged, ""]))
    assert [f for f in families] == ["r_total", "up", "h_seconds", "m_total"]
    series = {(n, tuple(sorted(lab.items()))): v for n, lab, v in families["r_total"]["series"]}  # type: ignore[attr-defined]
    assert len(series) == 6 and series[("r_total", (("route", "/b"), ("worker", "2")))] == 20
    assert 'up{worker="1"} 1' in merged and merged[-1] == "m_total 7"
    assert len(families["h_seconds"]["series"]) == 3 * 5  # type: ignore[arg-type]
    assert with_label(['a{b="c"} 1', "a 2", "# x"], "w", 'q"') == [
        'a{w="q\\"",b="c"} 1',
        'a{w="q\\""} 2',
        "# x",
    ]


def test_a_series_renders_the_same_every_time() -> None:
    """The series' rendered names and labels are kept between scrapes (domain.exposition):
    values change, escaping holds, two families of one name with other label names never share
    a line, and the kept ones stay bounded."""
    import domain.exposition as exposition

    fam = Family("c_total", "counter", "C.", ("k", "v"))
    other = Family("c_total", "counter", "C.", ("x", "y"))
    assert fam.line(("a\\b", 'q"\n'), 1) == 'c_total{k="a\\\\b",v="q\\"\\n"} 1'
    assert fam.line(("a\\b", 'q"\n'), 2.5) == 'c_total{k="a\\\\b",v="q\\"\\n"} 2.5'
    assert other.line(("a\\b", 'q"\n'), 1).startswith('c_total{x="a')
    assert Family("g", "gauge", "G.").line((), 3) == "g 3"
    for i in range(exposition._PREFIXES_MAX + 10):
        fam.line((str(i), "v"), i)
    assert len(exposition._PREFIXES) <= exposition._PREFIXES_MAX
    assert fam.line(("7", "v"), 7) == 'c_total{k="7",v="v"} 7'


def test_no_module_writes_help_or_type_lines() -> None:
    """HELP and TYPE lines come from `Family` declarations only (domain/exposition.py)."""
    bad = []
    for pkg in ("domain", "gateway", "evaluators", "storage"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "domain/exposition.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                parts = (
                    [node.value]
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    else []
                )
                if any(re.match(r"\s*# (HELP|TYPE) ", p) for p in parts):
                    bad.append(f"{rel}:{node.lineno}")
    assert not bad, f"hand-written exposition headers: {bad}"


async def _scrape_until(
    http: aiohttp.ClientSession, url: str, needed: tuple[str, ...], within_s: float = IMPORTS_S
) -> str:
    # The mirror process's counters reach the worker at its next stats broadcast, after its
    # copies (at its priority, beside whatever else the host runs).
    async def scraped() -> str | None:
        async with http.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            assert resp.content_type == "text/plain"
            text = await resp.text()
        if all(f"\n{name}" in text for name in needed) and '"observed_ok"} 0\n' not in text:
            return text
        return None

    text = await until(scraped, what=f"{needed} in /metrics", within_s=within_s, every_s=0.1)
    assert text is not None
    return text


async def test_whole_metrics_output_of_a_running_gateway(tmp_path: Path) -> None:
    """Every family of a running gateway's /metrics has one HELP and one TYPE line and follows
    the text format, including the mirror process's families relayed by the worker."""
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
                "db_url": f"sqlite+aiosqlite:///{tmp_path / 'm.db'}",
                "admin_token": f"ops:{TOKEN}",
                "counters_flush_interval_s": 0.2,
                "capture": True,
                "capture_share": 1.0,
                # About the text format, not priority: at SCHED_IDLE (the default) a CPU-bound
                # neighbour starves the mirror process for as long as it runs.
                "mirror_priority": "nice",
            },
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            body = {"name": "cand", "url": cand.url, "sample_rate": 1.0}
            async with http.post(f"{parts.url}/admin/candidates", json=body, headers=auth) as r:
                assert r.status == 201
            async with http.get(f"{parts.url}/admin/candidates", headers={}) as r:
                assert r.status == 401  # counted by the admin guard
            for i in range(3):  # distinct conversations: none deduplicated or waiting its turn
                chat = {"model": MODEL, "messages": [{"role": "user", "content": f"Hello {i}"}]}
                async with http.post(f"{parts.url}/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
                    await r.read()
            text = await _scrape_until(
                http,
                parts.url,
                (
                    'canary_mirror_copies_total{candidate="cand",outcome="observed_ok"} ',
                    "canary_writer_written_observations_total",
                    "canary_capture_total",
                    "canary_mirror_process_info",
                ),
            )
    finally:
        await cand.close()
        await live.close()
    families = parse_exposition(text)
    # Every plane's families are there: worker registry, its collectors, the admin guard, the
    # relayed mirror process (lanes, writer, capture, credentials) and the process wiring.
    for name in (
        "canary_proxy_requests_total",
        "canary_proxy_body_refused_total",
        "canary_connections_refused_total",
        "canary_admin_auth_failures_total",
        "canary_mirror_handoff_total",
        "canary_mirror_channel_up",
        "canary_mirror_process_restarts_total",
        "canary_registry_version",
        "canary_mirror_copies_total",
        "canary_mirror_target_copies_per_second",
        "canary_mirror_loop_lag_max_seconds",
        "canary_writer_queue_depth",
        "canary_capture_bytes",
        "canary_candidate_credentials_refused_total",
        "canary_mirror_process_info",
    ):
        assert name in families, name
    assert len(families) >= 50
    copies = families["canary_mirror_copies_total"]["series"]
    ok = [v for _, labels, v in copies if labels["outcome"] == "observed_ok"]  # type: ignore[attr-defined]
    assert ok and ok[0] >= 1
    failures = families["canary_admin_auth_failures_total"]["series"]
    assert failures == [("canary_admin_auth_failures_total", {}, 1.0)]
