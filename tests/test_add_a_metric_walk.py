"""docs/add-a-metric.md's walk of a quantity added to the rollout's evidence, followed as a new
contributor would: on a copy of the repository (every file git tracks or would track), its code
blocks applied as written (each insertion below the line the doc names, each new file whole),
then the copy migrated on SQLite and PostgreSQL and the rollout's tests run there. The files
changed are exactly the files the doc's table names; a file the change needs beyond them makes
the copy's tests fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# A copy of the tree and a second pytest run on it: the slow tier (docs/getting-started.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "add-a-metric.md"
SECTION = "## A quantity in the rollout's evidence"
# The doc's steps, in order: which file, an insertion below a line, a new file.
STEP = re.compile(
    r"In `(?P<file>[^`]+)`, (?=below)"
    r"|below the line\s+`(?P<anchor>[^`]+)`:\s*\n+```python\n(?P<code>.*?)```"
    r"|A new file, `(?P<new>[^`]+)`[^\n]*:\s*\n+```python\n(?P<whole>.*?)```",
    re.DOTALL,
)
TABLE_ROW = re.compile(r"^\| [^|]+ \| `(?P<file>[^`]+)` \|", re.MULTILINE)
# The rollout's tests the copy runs (the evidence, its storage on both dialects, the schema
# against the migrations, the frame, the proxy's path, the controller).
ROLLOUT_TESTS = (
    "tests/test_rollout_evidence.py",
    "tests/test_observation.py",
    "tests/storage/test_rollout_evidence.py",
    "tests/storage/test_migrations.py::test_models_match_latest_migration",
    "tests/storage/test_migrations.py::test_revisions_form_one_line",
    "tests/storage/test_migrations.py::test_up_and_down_on_populated_database",
    "tests/evaluators/test_rollout_units.py",
    "tests/mirror/test_mirror_frames.py",
    "tests/mirror/test_mirror_rollout.py",
    "tests/server/test_rollout_routing.py",
    "tests/control/test_rollout_controller.py",
    "tests/control/test_rollout_first_look.py",
)
SCHEMA_TEST = "test_models_match_latest_migration"
# Run in the copy after its tests: the new field travels from a worker's record through the
# RAMP frame and the table to a session summary, on SQLite.
PROBE = """
import asyncio, sys, tempfile
from pathlib import Path
import domain.observation, numpy as np
from domain.records import RolloutRecord, RolloutRequest
from evaluators.rollout.arms import session_units
from gateway.mirror.channel import frames
from storage.engine import make_engine, upgrade
from storage.models import RolloutRequestRow
from storage.reports.rollout import ROLLOUT_COLUMNS, rollout_requests
from storage.writer import rollout_row

assert Path(domain.observation.__file__).is_relative_to(Path.cwd()), domain.observation.__file__
name = sys.argv[1]
sent = RolloutRequest(generation=4, arm=1, session=-3, at=2.0, status=200, ttft_s=0.1,
                      e2e_s=0.9, finished=True, **{name: 0.05})
raw = frames.rollout_frame(sent)
got = RolloutRequest(**frames.ROLLOUT_LAYOUT.fields(raw[frames.FRAME.size:]))
assert getattr(got, name) == 0.05, got
assert ROLLOUT_COLUMNS[name] is np.float64, ROLLOUT_COLUMNS

async def main() -> None:
    url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/walk.db"
    await upgrade(url)
    engine = make_engine(url)
    record = RolloutRecord(**{f: getattr(got, f) for f in got.__struct_fields__}, turn=1)
    async with engine.begin() as conn:
        await conn.execute(RolloutRequestRow.__table__.insert(), [rollout_row(record)])
    cols = await rollout_requests(engine, 4, None, None)
    await engine.dispose()
    units = session_units(cols, slo_ttft_s=1.0, slo_e2e_s=10.0)
    summary = units.values[name.removesuffix("_s")]
    assert np.allclose(summary, np.log(0.05)), summary

asyncio.run(main())
print("probe ok")
"""


def walk_steps(doc: str) -> tuple[set[str], list[tuple[str, str | None, str]]]:
    """The files the section's table names, and its steps in order: (file, the line to insert
    below or None for a new file, the code)."""
    section = doc[doc.index(SECTION) :]
    named = {m["file"] for m in TABLE_ROW.finditer(section)}
    steps: list[tuple[str, str | None, str]] = []
    current = ""
    for m in STEP.finditer(section):
        if m["file"]:
            current = m["file"]
        elif m["anchor"]:
            assert current, f"an insertion below {m['anchor']!r} names no file before it"
            steps.append((current, m["anchor"], m["code"]))
        else:
            steps.append((m["new"], None, m["whole"]))
    return named, steps


def apply(tree: Path, steps: list[tuple[str, str | None, str]]) -> set[str]:
    """Each step applied to the copy as written; the files changed. An anchor must name exactly
    one line of its file (stripped), and a new file must not exist yet."""
    changed = set()
    for rel, anchor, code in steps:
        path = tree / rel
        if anchor is None:
            assert not path.exists(), f"{rel} exists already: the doc's new file is not new"
            path.write_text(code)
        else:
            lines = path.read_text().splitlines(keepends=True)
            at = [i for i, line in enumerate(lines) if line.strip() == anchor.strip()]
            assert len(at) == 1, f"{rel}: the line {anchor!r} occurs {len(at)} times"
            lines.insert(at[0] + 1, code)
            path.write_text("".join(lines))
        changed.add(rel)
    return changed


def _copy_tree(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        rel = raw.decode()
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


def test_the_doc_names_a_quantity_the_tree_does_not_have() -> None:
    """The example is new: its field is on no declaration yet, and every insertion's line is
    in the tree once."""
    named, steps = walk_steps(DOC.read_text())
    from domain.observation import Measured, describe

    fields = {f.name for f in describe(Measured)}
    new = re.findall(r"^\s+(\w+): Annotated", steps[0][2], flags=re.MULTILINE)
    assert new and not set(new) & fields, new
    assert {rel for rel, _, _ in steps} == named
    for rel, anchor, _ in steps:
        if anchor is not None:
            text = (ROOT / rel).read_text().splitlines()
            assert [line.strip() for line in text].count(anchor.strip()) == 1, (rel, anchor)
        else:
            assert not (ROOT / rel).exists(), rel


@pytest.mark.timeout(600)
def test_the_doc_walk_applied_as_written_passes_the_rollout_tests(tmp_path: Path) -> None:
    """Applied as written to a copy, the doc's blocks change exactly the files it names, and the
    copy's rollout tests pass on SQLite and PostgreSQL (the storage tests run on both), with the
    new quantity carried from a worker's record to a session summary."""
    named, steps = walk_steps(DOC.read_text())
    tree = tmp_path / "tree"
    _copy_tree(tree)
    assert apply(tree, steps) == named
    env = {**os.environ, "CANARY_REQUIRE_PG": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
         "-m", "not slow and not browser and not real_engine", *ROLLOUT_TESTS],
        cwd=tree, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    [field] = re.findall(r"^\s+(\w+): Annotated", steps[0][2], flags=re.MULTILINE)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, field],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0 and "probe ok" in probe.stdout, probe.stdout + probe.stderr


def test_a_walk_that_misses_a_file_fails(tmp_path: Path) -> None:
    """The check bites: the same walk without its migration leaves the copy's schema test red
    (the doc's step is what makes it green)."""
    named, steps = walk_steps(DOC.read_text())
    tree = tmp_path / "tree"
    _copy_tree(tree)
    partial = [s for s in steps if s[1] is not None]  # every insertion, no new file
    assert apply(tree, partial) < named
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
         "-m", "not postgres", "tests/storage/test_migrations.py::" + SCHEMA_TEST],
        cwd=tree, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    [field] = re.findall(r"^\s+(\w+): Annotated", steps[0][2], flags=re.MULTILINE)
    assert run.returncode != 0 and field in run.stdout, run.stdout[-2000:]
