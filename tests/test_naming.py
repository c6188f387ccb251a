"""The rollout has one word. No module, package, class or function outside migrations/ is named
with the other word ("ramp", in any case), and no file name says it either. "Ramp" stays a verb
of the prose (docs/rollout.md defines it); public names that already say it (the verdict
settings' `ramp_*` keys, wire and stored strings) are fields and strings, not names this
checks.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORD = re.compile("ramp", re.IGNORECASE)


def _tracked() -> list[str]:
    """Every file of the tree that git tracks or would track (new, not ignored), outside
    migrations/."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [p for p in out if p and not p.startswith("migrations/") and (ROOT / p).exists()]


def named_with_the_word(source: str, where: str) -> list[str]:
    """Each class, function or method of `source` whose name says the other word."""
    return [
        f"{where}:{node.lineno}: {type(node).__name__} {node.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and WORD.search(node.name)
    ]


def files_named_with_the_word(paths: list[str]) -> list[str]:
    """Each path with a folder or file name (a module, a package, a page) that says the word."""
    return [p for p in paths if any(WORD.search(part) for part in Path(p).parts)]


def test_no_module_class_or_function_says_the_other_word() -> None:
    paths = _tracked()
    found = files_named_with_the_word(paths)
    for path in paths:
        if path.endswith(".py"):
            found += named_with_the_word((ROOT / path).read_text(), path)
    assert found == []


def test_the_rule_sees_each_kind_of_name() -> None:
    """Each planted name is found (a rule that finds nothing passes vacuously), and prose,
    strings and fields that say the word are not names."""
    planted = (
        "class RampThing:\n    def start_ramp(self): ...\n"
        "async def _RAMPED(): ...\n"
        "def outer():\n    def inner_ramp(): ...\n"
    )
    names = sorted(f.rsplit(" ", 1)[1] for f in named_with_the_word(planted, "x.py"))
    assert names == ["RampThing", "_RAMPED", "inner_ramp", "start_ramp"]
    prose = (
        '"""To ramp is to move the weight."""\n'
        "ramp_power: float = 0.95  # a field keeps its public key\n"
        "STATE = 'ramping'\n"
    )
    assert named_with_the_word(prose, "x.py") == []
    assert files_named_with_the_word(
        ["bench/ramp_fleet.py", "gateway/server/ramp/arms.py", "docs/Ramp.md", "docs/rollout.md"]
    ) == ["bench/ramp_fleet.py", "gateway/server/ramp/arms.py", "docs/Ramp.md"]
