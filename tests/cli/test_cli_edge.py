"""The CLI has one error edge and names its exit codes once: no command catches the project's
errors to print them itself, and no exit code is a literal outside domain/errors.py."""

from __future__ import annotations

import ast
from pathlib import Path

from domain import errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("domain", "gateway", "evaluators", "storage")
# What only the edge (gateway/cli/errors.py) may catch: the tree and the admin client's errors.
_EDGE_ONLY = {"CanaryError", "AdminAPIError", "AdminUnreachable"}


def _trees(under: str) -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text())
        for p in sorted((ROOT / under).rglob("*.py"))
    }


def literal_exit_codes(trees: dict[str, ast.Module]) -> list[str]:
    """`exit_code = <int>` anywhere but domain/errors.py, and `return <int>` / `sys.exit(<int>)`
    in the CLI."""
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and path != "domain/errors.py"
                and any(
                    isinstance(t, ast.Name | ast.Attribute)
                    and (getattr(t, "id", None) or getattr(t, "attr", None)) == "exit_code"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                )
                and isinstance(node.value, ast.Constant)
            ):
                found.append(f"{path}:{node.lineno}: exit_code = {node.value.value!r}")
            if path.startswith("gateway/cli/") and (
                (isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
                 and type(node.value.value) is int)
                or (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit"
                    and node.args and isinstance(node.args[0], ast.Constant))
            ):  # fmt: skip
                found.append(f"{path}:{node.lineno}: literal exit code")
    return found


def private_error_edges(trees: dict[str, ast.Module]) -> list[str]:
    """Handlers of the project's errors in the CLI, outside its edge."""
    found = []
    for path, tree in trees.items():
        if path == "gateway/cli/errors.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
                if caught & _EDGE_ONLY:
                    found.append(f"{path}:{node.lineno}: catches {sorted(caught & _EDGE_ONLY)}")
    return found


def test_exit_codes_are_named_once() -> None:
    """Every exit code is one of domain.errors' names, never a literal elsewhere."""
    trees = {k: v for pkg in PACKAGES for k, v in _trees(pkg).items()}
    assert literal_exit_codes(trees) == []
    assert (errors.EXIT_OK, errors.EXIT_FAILURE, errors.EXIT_USAGE) == (0, 1, 2)


def test_the_cli_maps_errors_in_one_place() -> None:
    """No CLI module but gateway/cli/errors.py catches the project's errors to report them."""
    assert private_error_edges(_trees("gateway/cli")) == []


def test_the_rules_see_what_they_forbid() -> None:
    """The two scans find the forms they forbid (a rule that sees nothing passes vacuously)."""
    source = (
        "import sys\n"
        "class E:\n    exit_code = 2\n"
        "def f():\n"
        "    try:\n        g()\n    except AdminAPIError as exc:\n        return 2\n"
        "    sys.exit(1)\n"
    )
    trees = {"gateway/cli/commands/x.py": ast.parse(source)}
    assert len(literal_exit_codes(trees)) == 3
    assert len(private_error_edges(trees)) == 1
