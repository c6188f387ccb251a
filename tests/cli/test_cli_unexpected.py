"""An unexpected error (a bug) under a CLI command: one line on stderr naming the command, the
exception and the file holding its full traceback, exit 1, never a traceback on the terminal.

The error is injected into the real `canary report --db` run: an evaluator raises ValueError
while the report is computed in-process from a real SQLite database.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from evaluators.metrics import latency
from evaluators.pairs import synthetic
from gateway.cli.main import main
from storage.engine import make_engine, upgrade
from tests.evaluators.test_eval_pairs import SCENARIO, register, store

LINE = re.compile(
    r"^canary report: unexpected error \(a bug, please report it\): "
    r"ValueError: injected into an evaluator; full traceback in (\S+canary-error-\S+\.log)\n$"
)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A migrated SQLite database holding 60 pairs of `cand` (and its control)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"

    async def setup() -> None:
        await upgrade(url)
        engine = make_engine(url)
        try:
            await register(engine)
            await store(engine, synthetic.pairs(SCENARIO, 60, seed=1, start=time.time() - 600))
        finally:
            await engine.dispose()

    asyncio.run(setup())
    return url


@pytest.fixture
def broken_evaluator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The latency evaluators raise a ValueError, as a bug in one would."""

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("injected into an evaluator")

    monkeypatch.setattr(latency, "_latency", fail)


@pytest.mark.usefixtures("broken_evaluator")
def test_report_bug_is_one_line_and_a_saved_traceback(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`canary report --db` whose evaluator raises ValueError exits 1 with one stderr line
    naming the command, the error and a file (in the temporary directory, owner-only) that
    holds the full traceback; the terminal sees no traceback and the file no --db URL."""
    traces = tmp_path / "tmp"
    traces.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(traces))
    assert main(["report", "cand", "--db", db, "--since", "1h"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    match = LINE.match(err)
    assert match, err
    saved = Path(match.group(1))
    assert saved.parent == traces
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    text = saved.read_text(encoding="utf-8")
    assert text.startswith("canary report: unexpected error at ")
    assert "Traceback (most recent call last)" in text
    assert "in fail" in text and text.rstrip().endswith("ValueError: injected into an evaluator")
    assert db not in text


@pytest.mark.usefixtures("broken_evaluator")
def test_report_bug_with_no_writable_temp_dir_is_still_one_line(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the traceback cannot be written (no such temporary directory), the one line says
    so and why, and the exit code is still 1."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    assert main(["report", "cand", "--db", db, "--since", "1h"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("canary report: unexpected error (a bug, please report it): ValueError")
    assert "its traceback could not be saved: " in err and str(tmp_path / "missing") in err
