"""bench/ stands apart from tests/: no benchmark script imports the test suite (what both use
lives in bench/_shared/, which tests may import), and bench/RESULTS.md holds only the current
figures, with the history in bench/HISTORY.md."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS_MAX_LINES = 600


def imports_of_tests(source: str) -> list[str]:
    """Every import in `source`, at any depth (a function's lazy import included), of the
    `tests` package or a module under it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "tests"]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "tests"
        ):
            found.append(str(node.module))
    return found


def test_no_bench_module_imports_tests() -> None:
    """No module under bench/ (bench/_shared/ included) imports `tests`, lazily or not."""
    offenders = {
        path.relative_to(BENCH).as_posix(): names
        for path in sorted(BENCH.rglob("*.py"))
        if (names := imports_of_tests(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, offenders


def test_bench_shared_loads_no_tests_module() -> None:
    """Importing every bench/_shared/ module, in a fresh interpreter, loads no `tests` module
    (nor through a module it imports in turn)."""
    modules = sorted(p.stem for p in (BENCH / "_shared").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('bench._shared.' + m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tests'))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
    assert {"fleet", "nginx", "rollout_fleet", "browser_stack", "waiting"} <= set(modules)


def test_the_import_check_sees_every_form() -> None:
    """The check catches a plain, a from-, a submodule and a lazy import of tests, and passes
    bench's own package and a name that merely starts with "tests"."""
    planted = (
        "import tests\n"
        "from tests.upstreams import free_port\n"
        "import tests.evaluators.world as w\n"
        "def f():\n    from tests import waiting\n"
    )
    assert imports_of_tests(planted) == [
        "tests",
        "tests.upstreams",
        "tests.evaluators.world",
        "tests",
    ]
    assert imports_of_tests("from bench._shared import world\nimport testsuite\n") == []


def test_results_hold_only_current_figures() -> None:
    """bench/RESULTS.md is at most 600 lines of current figures and links the history,
    bench/HISTORY.md, which holds the rounds."""
    results = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    assert len(results.splitlines()) <= RESULTS_MAX_LINES, len(results.splitlines())
    assert "](HISTORY.md)" in results
    assert "\n# History" not in results
    history = (BENCH / "HISTORY.md").read_text(encoding="utf-8")
    assert "](RESULTS.md)" in history and history.count("\n## ") >= 30
