"""The documentation is true: the commands, requests, keys, defaults and metric names that
README.md, docs/ and the example configs show are checked against the real argument parser, a
real gateway in front of simulated engines, the real config types and a real /metrics scrape;
README.md stays a landing page whose Quickstart is what .ci/run runs, and the docs site
(mkdocs.yml, docs/hooks.py) holds every page and generates the API and command references.

Conventions the docs follow so that this module can read them: shell examples sit in ```bash
blocks, with `\\` continuations; a curl example is followed by a `# → STATUS …` comment naming
the status(es) it answers; examples use `http://canary-gateway:8080` for the gateway, `$TOKEN`
for an admin token and the placeholder URLs in `URL_PLACEHOLDERS`; tables whose first header is
`key`, `setting` or `metric` list config keys, verdict settings and metric names. The examples
build on one another in the order of `WALKTHROUGH` (register, report, promote, roll back).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec
import pytest
import yaml

from domain.endpoint import Endpoint
from evaluators.judge.metric import MetricResult
from evaluators.judge.settings import VerdictSettings
from evaluators.judge.verdict import Reason
from evaluators.pairs import synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.report.build import build_report
from evaluators.report.model import PairsSummary, Report, report_to_json
from gateway.cli import main as cli
from gateway.config.load import load_config
from gateway.config.reference import reference
from gateway.config.sections import CandidateConfig
from gateway.control.admin.openapi import openapi_document
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS_DIR = ROOT / "docs"
# The pages whose examples run against one gateway, in the order they build on one another.
WALKTHROUGH = tuple(
    DOCS_DIR / name
    for name in (
        "getting-started.md",
        "candidates.md",
        "reports-and-statistics.md",
        "promoting.md",
    )
)
DOCS = (
    README,
    *WALKTHROUGH,
    *sorted(p for p in DOCS_DIR.rglob("*.md") if p not in WALKTHROUGH),
)
# Generated from the config's declaration and checked against it by its own test.
CONFIG_PAGE = DOCS_DIR / "configuration.md"
README_MAX_LINES = 250
# The Quickstart's two blocks, exactly as .ci/run extracts and runs them.
QUICKSTART = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && canary demo\n",
    ". .venv/bin/activate && pip install -e '.[dev]' && pytest -n 2\n",
)
DEMO_CONFIG = ROOT / "configs" / "demo.toml"
DEPLOY_CONFIG = ROOT / "configs" / "production-postgres.toml"
SCHEMA_DOC = ROOT / "docs" / "report-schema.md"

GATEWAY = "http://canary-gateway:8080"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the model the README's requests name
TOKEN = "tok-docs-5e1f0c9a7d"
PG_URL = "postgresql+asyncpg://canary@postgres:5432/canary"  # the README's database
URL_PLACEHOLDERS = ("http://vllm-bikv:8000", "http://vllm:8000")
SHELL = ("bash", "sh", "console")

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_STATUS = re.compile(r"\b[1-5]\d\d\b")
_SPLIT = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")
_INLINE = re.compile(r"`(canary [^`]+)`")
INLINE_VALUES = {"NAME": "bi-kv", "N": "2", "FILE": "gateway.toml"}


# --- reading the docs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One shell command of a docs block, continuations joined, with its `# →` claim."""

    text: str
    claim: str
    where: str


def blocks(path: Path) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(path.read_text(encoding="utf-8"))]


def shell_commands(path: Path) -> list[Command]:
    """The commands of the shell blocks of one document, in order."""
    out: list[Command] = []
    for lang, body in blocks(path):
        if lang not in SHELL:
            continue
        pending = ""
        for raw in body.splitlines():
            line = raw.strip()
            if not pending and line.startswith("#"):
                if line.startswith("# →") and out:
                    last = out[-1]
                    out[-1] = Command(last.text, f"{last.claim} {line[3:].strip()}", last.where)
                continue
            if not pending and not line:
                continue
            pending = f"{pending} {line}".strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            out.append(Command(pending, "", path.name))
            pending = ""
    return out


def canary_lines() -> Iterator[tuple[str, str]]:
    """(where, `canary …`) for every canary invocation in the docs' shell blocks and the
    example configs' comments."""
    for path in DOCS:
        for cmd in shell_commands(path):
            for segment in _SPLIT.split(cmd.text):
                if segment.startswith("canary "):
                    yield path.name, segment
    for path in (DEMO_CONFIG, DEPLOY_CONFIG):
        for line in path.read_text(encoding="utf-8").splitlines():
            text = line.lstrip("# ").split("  #", 1)[0].strip()
            if text.startswith("canary "):
                yield path.name, text


def tables(path: Path) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of each markdown table outside fenced blocks."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found: list[tuple[list[str], list[list[str]]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(rows) >= 2:
            found.append((rows[0], rows[2:]))
        rows = []
    return found


def table_column(header: str) -> list[list[str]]:
    """Body rows of every docs table whose first header cell is `header` (the generated
    configuration page aside: its own test keeps it in step with the config)."""
    pages = [path for path in DOCS if path != CONFIG_PAGE]
    found = [body for path in pages for head, body in tables(path) if head[0] == header]
    return [row for body in found for row in body]


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


# --- a real gateway for the examples ----------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """A running gateway and what the examples' placeholders stand for."""

    url: str
    db_url: str
    urls: dict[str, str]

    def substitute(self, text: str) -> str:
        for placeholder, real in self.urls.items():
            text = text.replace(placeholder, real)
        return text.replace("$TOKEN", TOKEN)


@contextlib.asynccontextmanager
async def stage(tmp_path: Path) -> AsyncIterator[Stage]:
    """The complete gateway on 127.0.0.1:0 with a token, in front of a simulated production
    engine serving the README's model, and a simulated bi-KV engine for candidates."""
    fast = {"time_scale": 0.02, "served_model_names": (MODEL,)}
    live = await start_sim(get_profile("baseline", **fast))
    bikv = await start_sim(get_profile("bi-kv", **fast))
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'docs.db'}"
    try:
        config = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": live.url,
                "db_url": db_url,
                "admin_token": f"docs:{TOKEN}",
                "counters_flush_interval_s": 0.2,
                # The examples ask for reports: wait for the report process (idle priority)
                # however busy the host, as tests/control/test_admin_harness.py does.
                "report_start_wait_s": 120.0,
            },
        )
        async with running(config) as parts:
            urls = {
                GATEWAY: parts.url,
                URL_PLACEHOLDERS[0]: bikv.url,
                URL_PLACEHOLDERS[1]: live.url,
                PG_URL: db_url,
            }
            yield Stage(parts.url, db_url, urls)
    finally:
        await bikv.close()
        await live.close()


@dataclass(frozen=True)
class Curl:
    method: str
    url: str
    headers: dict[str, str]
    data: bytes | None


def parse_curl(argv: list[str]) -> Curl:
    """The request a curl command line sends; only the flags the docs use are understood."""
    method, url, data = "", "", None
    headers: dict[str, str] = {}
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-s", "--silent", "-S", "--show-error", "-f", "--fail", "-i", "--include"):
            continue
        if arg in ("-o", "--output", "-w", "--write-out"):
            next(args)
        elif arg in ("-X", "--request"):
            method = next(args)
        elif arg in ("-H", "--header"):
            name, _, value = next(args).partition(":")
            headers[name.strip()] = value.strip()
        elif arg in ("-d", "--data", "--data-raw"):
            data = next(args).encode()
        else:
            assert not arg.startswith("-"), f"curl flag {arg!r} is not understood by this test"
            url = arg
    if data is not None:
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")  # as curl does
    return Curl(method or ("POST" if data is not None else "GET"), url, headers, data)


# --- tests ------------------------------------------------------------------------------------


def test_quickstart_has_exactly_two_blocks() -> None:
    """The Quickstart section holds the two shell blocks .ci/run extracts and runs verbatim."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", section, re.S)
    assert len(found) == 2
    assert "canary demo" in found[0]
    assert "pytest" in found[1]


def test_canary_commands_parse() -> None:
    """Every `canary …` line in the docs and the example configs parses with the real parser
    and names a real subcommand; so does every inline `canary …` of the prose (NAME, N and
    FILE standing for values), and a bare `canary COMMAND` names a real one."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = list(canary_lines())
    assert len(found) >= 25
    for path in DOCS:
        for span in _INLINE.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
            if len(span.split()) == 2:
                assert span.split()[1] in commands.choices, f"{path.name}: `{span}`"
            else:
                found.append((path.name, span))
    for where, line in found:
        argv = [INLINE_VALUES.get(a, a) for a in shlex.split(line)[1:]]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `{line}` does not parse")
        assert args.command == argv[0], f"{where}: `{line}`"
        assert callable(args.func)


async def test_curl_examples_answer_as_documented(tmp_path: Path) -> None:
    """Each curl example of README.md and docs/, run in the pages' order against a real gateway,
    answers with a status its `# →` comment names (the gate says 425: a fresh candidate is on
    hold)."""
    examples = [c for p in DOCS for c in shell_commands(p) if c.text.startswith("curl ")]
    assert len(examples) >= 9
    async with stage(tmp_path) as st, aiohttp.ClientSession() as http:
        for cmd in examples:
            claimed = {int(s) for s in _STATUS.findall(cmd.claim)}
            assert claimed, f"no '# → STATUS' comment after `{cmd.text}`"
            req = parse_curl(shlex.split(st.substitute(cmd.text)))
            async with http.request(
                req.method, req.url, headers=req.headers, data=req.data
            ) as resp:
                body = await resp.read()
            assert resp.status in claimed, (cmd.text, resp.status, body[:300])
            if req.url.endswith("/gate"):
                assert resp.status == 425, body[:300]


async def test_cli_admin_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' candidates, report, promote and rollback lines, in the pages' order, run
    against a real gateway: each exits 0, except an unforced promote of a candidate on hold and
    a rollback with nothing to undo, which exit 2 as documented."""
    admin = ("candidates", "report", "promote", "rollback")
    pages = {p.name for p in DOCS}
    lines = [line for where, line in canary_lines() if where in pages]
    runnable = [line for line in lines if line.split()[1] in admin]
    assert len(runnable) >= 10
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CANARY_ADMIN_TOKEN", TOKEN)
    async with stage(tmp_path) as st:
        monkeypatch.setenv("CANARY_STORAGE_DB_URL", st.db_url)
        for line in runnable:
            argv = shlex.split(st.substitute(line))[1:]
            if argv[0] != "report" and "--admin-url" not in argv:
                argv += ["--admin-url", st.url]
            code = await asyncio.to_thread(cli.main, argv)
            out = capsys.readouterr()
            refused = (argv[0] == "promote" and "--force" not in argv) or argv[0] == "rollback"
            assert code == (2 if refused else 0), (line, code, out.err)
    assert (tmp_path / "bi-kv.html").read_text(encoding="utf-8").startswith("<!")


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    if isinstance(value, dict):
        return msgspec.json.encode(value).decode()
    return str(value)


def test_config_keys_and_defaults_in_docs_are_real() -> None:
    """Every key in a `key` table is a gateway setting (by its dotted name, `[section] key`, or
    its flat name of before the sections) or a candidate setting with the stated default, and
    every `setting` a verdict setting with its default."""
    defaults: dict[str, Any] = {}
    for k in reference():
        for name in (f"{k.section}.{k.key}", f"[{k.section}] {k.key}", k.flat or k.key):
            defaults[name] = k.default
    for f in msgspec.structs.fields(CandidateConfig):
        defaults.setdefault(f.name, f.default)
    defaults["verdict"] = {}
    verdict = msgspec.structs.asdict(VerdictSettings())
    keys, settings = table_column("key"), table_column("setting")
    assert len(keys) >= 10
    assert len(settings) >= 5
    for rows, known in ((keys, defaults), (settings, verdict)):
        for row in rows:
            name = unquote(row[0])
            assert name in known, f"`{name}` is not a setting"
            value = known[name]
            shown = {_default_text(value), json.dumps(value), "unset" if value is None else ""}
            assert unquote(row[1]) in shown, f"default of `{name}`"


def test_toml_blocks_in_docs_load(tmp_path: Path) -> None:
    """A TOML block shown in the docs is a valid gateway config."""
    for path in DOCS:
        for i, (lang, body) in enumerate(blocks(path)):
            if lang == "toml":
                file = tmp_path / f"{path.stem}-{i}.toml"
                file.write_text(body, encoding="utf-8")
                load_config(str(file), environ={})


def test_example_configs_load_and_agree_with_the_readme() -> None:
    """configs/demo.toml and the PostgreSQL deployment example load without CANARY_ variables;
    the demo config points at the simulators the README starts, and the deployment shares one
    database between a bi-KV candidate and a control that mirror the same sessions."""
    demo = load_config(str(DEMO_CONFIG), environ={})
    assert demo.live.url is not None
    ports = {urlsplit(u).port for u in [demo.live.url, *(c.url for c in demo.candidates)]}
    sims = [shlex.split(line) for where, line in canary_lines() if line.startswith("canary sim ")]
    readme_ports = {int(a[a.index("--port") + 1]) for a in sims if "--profile" in a}
    assert readme_ports >= ports
    deploy = load_config(str(DEPLOY_CONFIG), environ={})
    assert deploy.storage.db_url.startswith("postgresql+asyncpg://")
    assert deploy.live.url is not None
    kinds = {c.kind: c for c in deploy.candidates}
    assert set(kinds) == {"bi-kv", "control"}
    assert kinds["bi-kv"].sample_rate == kinds["control"].sample_rate == 1.0
    assert kinds["bi-kv"].sampling == kinds["control"].sampling == "session"


async def test_documented_metrics_are_the_exported_ones(tmp_path: Path) -> None:
    """The docs' metric table names exactly the metric families a real gateway exports at
    /metrics, after proxying a request mirrored to a candidate."""
    documented = {unquote(row[0]) for row in table_column("metric")}
    async with stage(tmp_path) as st, aiohttp.ClientSession() as http:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        cand = {"name": "bi-kv", "url": st.urls[URL_PLACEHOLDERS[0]], "sample_rate": 1.0}
        async with http.post(f"{st.url}/admin/candidates", json=cand, headers=auth) as resp:
            assert resp.status == 201
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}
        async with http.post(f"{st.url}/v1/chat/completions", json=chat) as resp:
            assert resp.status == 200
            await resp.read()
        async with http.get(f"{st.url}/metrics") as resp:
            text = await resp.text()
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert documented == exported


def test_admin_urls_in_docs_are_real_routes() -> None:
    """Every admin API URL the docs show (shell and YAML alike) is a route of the OpenAPI
    document."""
    paths = [
        re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(p)) + "$")
        for p in openapi_document()["paths"]
    ]
    found = 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8").replace("{{args.candidate}}", "bi-kv")
        for url in re.findall(re.escape(GATEWAY) + r"/admin(/[^\s'\")`]*)", text):
            found += 1
            assert any(p.match(url) for p in paths), f"{path.name}: /admin{url}"
    assert found >= 10


def test_relative_links_in_docs_resolve() -> None:
    """Every relative markdown link in README.md and docs/ points at a file of the repository,
    and a docs page's links stay inside docs/ (the site holds nothing else)."""
    checked = 0
    for path in DOCS:
        text = _FENCE.sub("", path.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            checked += 1
            resolved = (path.parent / target).resolve()
            assert resolved.exists(), f"{path.name}: {target}"
            if path != README:
                assert resolved.is_relative_to(DOCS_DIR), f"{path.name}: {target} leaves docs/"
    assert checked >= 20


def test_readme_is_a_landing_page_whose_quickstart_ci_runs() -> None:
    """README.md is at most 250 lines, and the two blocks .ci/run's own extraction code finds
    under its Quickstart are exactly the install-and-demo and dev-install-and-pytest commands."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    extract = ci.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    for index, expected in enumerate(QUICKSTART):
        run = subprocess.run(
            [sys.executable, "-c", extract, str(index)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert run.stdout == expected + "\n", (index, run.stdout)


def _nav_pages(entries: Any) -> Iterator[str]:
    """Every page path of an mkdocs nav, sections flattened."""
    for entry in entries:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from [value] if isinstance(value, str) else _nav_pages(value)


def _hooks() -> ModuleType:
    """docs/hooks.py, the mkdocs hook module, imported from its file."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS_DIR / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_docs_page_is_in_the_nav() -> None:
    """Every markdown page under docs/ and every page docs/hooks.py generates is in mkdocs.yml's
    nav, and the README's links into docs/ name pages of that nav."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_pages(config["nav"]))
    on_disk = {p.relative_to(DOCS_DIR).as_posix() for p in DOCS_DIR.rglob("*.md")}
    assert on_disk - nav == set()
    assert set(_hooks().GENERATED) - nav == set()
    readme = README.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([^)#\s]+\.md)", readme))
    assert len(linked) >= 8
    assert linked - nav == set()


def test_api_reference_renders_every_operation() -> None:
    """The generated API page has a section for every path and method of the OpenAPI document,
    with its summary, every request body field and every response status."""
    doc = openapi_document()
    page = _hooks().render_api(doc)
    schemas = doc["components"]["schemas"]
    operations = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            operations += 1
            section = page.split(f"\n## {method.upper()} /admin{path}\n", 1)[1].split("\n## ")[0]
            assert op["summary"] in section
            body = op.get("requestBody")
            if body is not None:
                name = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                for field in schemas[name]["properties"]:
                    assert f"| `{field}` |" in section, (path, method, field)
            for status in op["responses"]:
                assert f"\n| {status} |" in section, (path, method, status)
    assert operations >= 10


def test_cli_reference_and_index_are_generated() -> None:
    """The generated command page holds the help of every `canary` subcommand, and the site's
    index is README.md with its links kept inside the site."""
    hooks = _hooks()
    parser = cli.build_parser()
    page = hooks.render_cli(parser)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert f"## `canary {name}`" in page
        assert sub.format_usage().split()[1:3] == ["canary", name]
    index = hooks.render_index(README.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _FENCE.sub("", index)):
        assert "://" in target or (DOCS_DIR / target).exists(), target


def _synthetic_report() -> Report:
    """A report built from synthetic pairs with a control, through every evaluator."""
    scenario = synthetic.Scenario(control=synthetic.Arm())
    return build_report(
        pairset_from_pairs(synthetic.pairs(scenario, 300, seed=3)),
        candidate=Endpoint(name="bi-kv", url="http://c", kind="bi-kv"),
        live=Endpoint(name="live", url="http://l", role="live"),
        control=Endpoint(name="control", url="http://k", kind="control"),
        accounting={"sampled": 300, "observed_ok": 300, "sent": 300},
        settings=VerdictSettings(),
    )


def test_report_schema_doc_matches_the_report() -> None:
    """docs/report-schema.md names exactly the report's top-level fields and arms_load keys, and
    its JSON excerpts decode into the report's own types with the same keys."""
    real = msgspec.json.decode(report_to_json(_synthetic_report()))
    fields = set()
    for row in table_column("field"):
        fields |= set(re.findall(r"`(\w+)`", row[0]))
    assert fields == set(Report.__struct_fields__)
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    load_keys = set(re.findall(r"`(\w+)`", text.split("Each `arms_load` row has", 1)[1]))
    assert load_keys - {"arms_load"} == set(real["arms_load"]["candidate"])
    turn_keys = next(set(row) for row in real["ttft_by_turn"] if row["n"])
    seen = set()
    for lang, body in blocks(SCHEMA_DOC):
        if lang != "json":
            continue
        obj = msgspec.json.decode(body.encode())
        if isinstance(obj, list):
            msgspec.convert(obj, list[Reason])
            seen.add("reasons")
        elif "used_latency" in obj:
            assert set(obj) == set(PairsSummary.__struct_fields__)
            msgspec.convert(obj, PairsSummary)
            seen.add("pairs")
        elif "role" in obj:
            assert set(obj) == set(MetricResult.__struct_fields__)
            msgspec.convert(obj, MetricResult)
            seen.add("metric")
        else:
            assert set(obj) == turn_keys
            seen.add("turn")
    assert seen == {"reasons", "pairs", "metric", "turn"}


def test_test_references_in_docs_exist() -> None:
    """Every `tests/[group/]test_x.py::test_name` the docs cite as proof is a test that exists."""
    cited = 0
    for path in DOCS:
        for file, name in re.findall(
            r"tests/((?:\w+/)?test_\w+\.py)::(test_\w+)", path.read_text()
        ):
            cited += 1
            source = (ROOT / "tests" / file).read_text(encoding="utf-8")
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{file}::{name}"
    assert cited >= 20


# A design reference: `docs/design.md, "<section>"` (a heading of that page), anywhere in the
# tree; and the form that cannot be resolved from the repository, a numbered "DESIGN.md §N".
_DESIGN_REF = re.compile(r'docs/design\.md,\s+"([^"]+)"')
_NUMBERED_REF = re.compile(r"DESIGN\.md,?\s*§\s*[\d.]+")
_TREE = ("domain", "gateway", "evaluators", "storage", "tests", "bench", "docs", "migrations")


def design_references(text: str) -> tuple[list[str], list[str]]:
    """(the section names `text` cites in docs/design.md, its numbered DESIGN.md references)."""
    named = [" ".join(m.group(1).split()) for m in _DESIGN_REF.finditer(text)]
    return named, _NUMBERED_REF.findall(text)


def test_design_references_resolve() -> None:
    """Every design reference in the tree names a heading of docs/design.md; none is a numbered
    "DESIGN.md §N", which no file of the repository holds."""
    page = (DOCS_DIR / "design.md").read_text()
    headings = {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", page, re.M)}
    bad, cited = [], 0
    files = [ROOT / "README.md"]
    files += [p for d in _TREE for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".md")]
    for path in files:
        if path == Path(__file__):
            continue
        named, numbered = design_references(path.read_text())
        cited += len(named)
        rel = path.relative_to(ROOT)
        bad += [f"{rel}: {n!r} is no heading of docs/design.md" for n in named if n not in headings]
        bad += [f"{rel}: {n!r} (name a docs/design.md section)" for n in numbered]
    assert bad == [] and cited >= 7
    assert design_references('x (docs/design.md,\n"The mirror path") DESIGN.md §3.4') == (
        ["The mirror path"],
        ["DESIGN.md §3.4"],
    )
