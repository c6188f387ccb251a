"""The import rules of the layout (docs/design.md, "Modules"), checked on the source tree.

Every `import` and `from ... import` of our packages is read with `ast`, at any depth (inside
functions too, so a deferred import cannot dodge a rule); only `if TYPE_CHECKING:` blocks are
exempt, since they run no code. Cycles are checked on the same graph: a function-level import
is an import (it runs the first time the function does), so it may not close a cycle either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "gateway", "evaluators", "storage")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_pkg = MODULES[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str, *, top_level_only: bool) -> Iterator[str]:
    """Our modules that `module` imports (a `from pkg import name` of a submodule counts as
    importing that submodule)."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))

    def walk(body: list[ast.stmt], depth: int) -> Iterator[str]:
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        yield alias.name
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, node)
                if target.split(".")[0] not in PACKAGES:
                    continue
                subs = [f"{target}.{a.name}" for a in node.names]
                found = [s for s in subs if s in MODULES]
                yield from found or [target]
                if found and len(found) < len(subs):
                    yield target
            if top_level_only and depth == 0 and isinstance(node, (ast.FunctionDef,
                    ast.AsyncFunctionDef, ast.ClassDef)):  # fmt: skip
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.AST):
                    stmts = [h for h in inner if isinstance(h, ast.stmt)]
                    for h in inner:
                        if isinstance(h, ast.ExceptHandler):
                            stmts.extend(h.body)
                    yield from walk(stmts, depth + 1)

    yield from walk(tree.body, 0)


def _violations(rule: str, allowed: tuple[str, ...], sources: tuple[str, ...]) -> list[str]:
    return [
        f"{module} imports {target} ({rule})"
        for module in MODULES
        if module.startswith(sources)
        for target in _imports(module, top_level_only=False)
        if not target.startswith(allowed)
    ]


def test_domain_imports_nothing_of_ours() -> None:
    """`domain` is the bottom layer: it imports no other package of the project."""
    assert _violations("domain imports only domain", ("domain",), ("domain",)) == []


def test_storage_imports_only_domain() -> None:
    """`storage` depends on `domain` only: never on the gateway or the evaluators."""
    assert _violations("storage imports only domain", ("domain", "storage"), ("storage",)) == []


def test_evaluators_reach_storage_only_through_the_loader() -> None:
    """Only `evaluators.pairs.load` reads storage, and only the report path's SQL
    (`storage.reports`); no evaluator imports the gateway."""
    bad = []
    for module in MODULES:
        if not module.startswith("evaluators"):
            continue
        for target in _imports(module, top_level_only=False):
            if target.startswith("gateway"):
                bad.append(f"{module} imports {target}")
            if target.startswith("storage") and module != "evaluators.pairs.load":
                bad.append(f"{module} imports {target} (only evaluators.pairs.load may)")
            if target.startswith("storage") and not target.startswith("storage.reports"):
                bad.append(f"{module} imports {target} (the loader reads storage.reports)")
    assert bad == []


# SQL toolkits and database drivers: storage's business, never the evaluators'.
_DATABASE_LIBRARIES = ("sqlalchemy", "aiosqlite", "asyncpg", "psycopg", "psycopg2", "alembic")


def _foreign_imports(source: str) -> Iterator[str]:
    """Every top-level package name the source imports, at any depth, `TYPE_CHECKING` included
    (an annotation that needs SQLAlchemy is SQLAlchemy's business too)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.split(".")[0]


def test_evaluators_import_no_sql_and_no_driver() -> None:
    """No module under evaluators/ imports SQLAlchemy, Alembic or a database driver, at any
    depth: the evaluators are pure, and their SQL lives in `storage.reports`."""
    bad = [
        f"{module} imports {name}"
        for module in MODULES
        if module.startswith("evaluators")
        for name in _foreign_imports(MODULES[module].read_text())
        if name in _DATABASE_LIBRARIES
    ]
    assert bad == []


def test_data_plane_imports_neither_storage_nor_evaluators() -> None:
    """`gateway.server` (the hot path) imports neither storage nor the evaluators."""
    rule = "gateway.server imports no storage or evaluators"
    assert _violations(rule, ("domain", "gateway"), ("gateway.server",)) == []


ROLLOUT_SERVING = ("gateway.rollout.arms", "gateway.rollout.route", "gateway.rollout.hooks")


def test_the_rollouts_serving_side_stays_on_the_data_plane() -> None:
    """The rollout's serving modules (on a worker's request path) import neither storage nor the
    evaluators, and the data plane imports only them of the rollout, never its control side."""
    rule = "the rollout's serving side imports no storage or evaluators"
    assert _violations(rule, ("domain", "gateway"), ROLLOUT_SERVING) == []
    bad = [
        f"{module} imports {target}"
        for module in MODULES
        if module.startswith(("gateway.server", *ROLLOUT_SERVING))
        for target in _imports_any(module, ("gateway.rollout",))
        if target not in (*ROLLOUT_SERVING, "gateway.rollout")
    ]
    assert bad == []


def test_renderers_import_the_model_not_the_builder() -> None:
    """The report renderers import the report model, never the builder (no report cycle)."""
    renderers = ("evaluators.report.text", "evaluators.report.html", "evaluators.report.svg")
    bad = [
        f"{module} imports {target}"
        for module in renderers
        for target in _imports(module, top_level_only=False)
        if target in ("evaluators.report.build", "evaluators.report.render")
    ]
    assert bad == []


PLANES = (
    "gateway.server",
    "gateway.mirror",
    "gateway.control",
    "gateway.rollout",
    "gateway.sim",
    "gateway.process",
    "gateway.cli",
)
BELOW_PLANES = ("gateway.config", "gateway.credentials", "gateway.logs", "gateway.lifecycle")


def _imports_any(module: str, targets: tuple[str, ...]) -> list[str]:
    return [
        t
        for t in _imports(module, top_level_only=False)
        if any(t == p or t.startswith(p + ".") for p in targets)
    ]


def test_planes_import_nothing_of_the_wiring() -> None:
    """No module of server/, mirror/, control/, rollout/ or sim/ imports the process wiring or the
    CLI: the wiring sits on top and composes them, never the other way round."""
    planes = tuple(p for p in PLANES if p not in ("gateway.process", "gateway.cli"))
    bad = [
        f"{module} imports {target}"
        for module in MODULES
        if module.startswith(planes)
        for target in _imports_any(module, ("gateway.process", "gateway.cli"))
    ]
    assert bad == []


def test_config_and_helpers_sit_below_the_planes() -> None:
    """Config, credentials, logs and the process lifecycle helpers import no plane."""
    bad = [
        f"{module} imports {target}"
        for module in BELOW_PLANES
        for target in _imports_any(module, PLANES)
    ]
    assert bad == []


# The workload generator is a client of the gateway: it meters responses with the gateway's own
# meter so client-side TTFT has the same definition. The meter imports nothing of the gateway
# (only domain, below).
_SIM_MAY_IMPORT = {("gateway.sim.workload", "gateway.server.meter")}


def test_simulator_imports_no_plane() -> None:
    """The simulator is not the gateway: `gateway.sim` imports no plane of it."""
    others = tuple(p for p in PLANES if p != "gateway.sim")
    bad = [
        f"{module} imports {target}"
        for module in MODULES
        if module.startswith("gateway.sim")
        for target in _imports_any(module, others)
        if (module, target) not in _SIM_MAY_IMPORT
    ]
    assert bad == []
    meter = _imports("gateway.server.meter", top_level_only=False)
    # The wire shapes it decodes and its clock of token events: leaves themselves.
    leaves = (
        "gateway.server.stream.responses",
        "gateway.server.stream.chat",
        "gateway.server.stream.gaps",
    )
    assert [t for t in meter if not t.startswith(("domain", *leaves))] == []
    for leaf in leaves:
        below = [t for t in _imports(leaf, top_level_only=False) if t in MODULES]
        assert [t for t in below if not t.startswith(("domain", *leaves))] == [], leaf


def test_no_import_cycles() -> None:
    """The import graph of the four packages, function-level imports included, has no cycle."""
    graph = {m: set(_imports(m, top_level_only=False)) & MODULES.keys() for m in MODULES}
    # A package's __init__ is imported with any of its submodules; that is not a cycle of ours.
    for m in graph:
        graph[m] -= {p for p in graph[m] if m.startswith(p + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_the_rules_see_imports() -> None:
    """The checker finds imports at all depths (a rule that sees nothing passes vacuously)."""
    assert "domain.endpoint" in set(_imports("storage.queries", top_level_only=False))
    assert "storage.reports.pairs" in set(_imports("evaluators.pairs.load", top_level_only=False))
    assert "sqlalchemy" in set(_foreign_imports(MODULES["storage.reports.pairs"].read_text()))
    deep = "def f():\n    if TYPE_CHECKING:\n        from asyncpg.pool import Pool\n"
    assert list(_foreign_imports(deep)) == ["asyncpg"]
    deferred = set(_imports("gateway.cli.commands.report", top_level_only=False))
    assert "evaluators.report.build" in deferred
    assert "evaluators.report.build" not in set(
        _imports("gateway.cli.commands.report", top_level_only=True)
    )
    assert "gateway.cli.progress" in set(
        _imports("gateway.cli.commands.demo", top_level_only=False)
    )


MAX_MODULES_PER_FOLDER = 12


def _package_dirs() -> list[Path]:
    return sorted({p.parent for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")})


def test_no_folder_holds_more_than_twelve_modules() -> None:
    """A package folder holds at most 12 modules directly (its __init__ included): past that it
    wants splitting by stage, as gateway/mirror/ is."""
    crowded = {
        str(d.relative_to(ROOT)): n
        for d in _package_dirs()
        if (n := len(list(d.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_every_package_docstring_names_what_is_there() -> None:
    """Each package's docstring names each of its modules and subpackages (a map that lists what
    moved away, or leaves out what is there, misleads the next reader)."""
    missing = []
    for d in _package_dirs():
        doc = ast.get_docstring(ast.parse((d / "__init__.py").read_text())) or ""
        names = [p.stem for p in d.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        names += [p.name for p in d.iterdir() if (p / "__init__.py").exists()]
        missing += [f"{d.relative_to(ROOT)}: {n}" for n in sorted(names) if n not in doc]
    assert missing == []
