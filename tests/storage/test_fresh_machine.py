"""The test command on a machine where nothing listens for PostgreSQL: a throwaway server from
the local binaries, one skip line without them, a failure when CI requires both dialects.

Each case runs pytest on two PostgreSQL-parametrized storage tests in a child process, with
CANARY_TEST_PG_DSN at a port where nothing listens."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import throwaway_pg
from tests.fixtures_db import _resolve_pg

ROOT = Path(__file__).resolve().parents[2]
SUBSET = [
    "tests/storage/test_storage_engine.py::test_dialect_settings",
    "tests/storage/test_storage_engine.py::test_reconnects_after_terminated_backends",
]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CANARY_TEST_PG", "CANARY_REQUIRE_PG", "PYTEST_"))
    }
    child_env |= {
        "PYTHONPATH": str(ROOT),
        "CANARY_TEST_PG_DSN": f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--basetemp", str(tmp_path / "inner"), *SUBSET],
        cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip


@pytest.mark.postgres
def test_a_throwaway_server_runs_the_postgresql_half(tmp_path: Path) -> None:
    """With nothing on the configured port, the PostgreSQL tests pass on a server started from
    the local binaries, and the run says so in one line; the server is gone afterwards."""
    bindir = throwaway_pg.find_bindir()
    if bindir is None:
        _resolve_pg()  # no server either: skipped in the PostgreSQL half's one summary line
        pytest.skip("no local PostgreSQL binaries to start a throwaway server from")
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^4 passed", run.stdout, re.M), run.stdout
    lines = [line for line in run.stdout.splitlines() if "throwaway server" in line]
    assert len(lines) == 1, run.stdout
    port = int(re.search(r"127\.0\.0\.1:(\d+)/postgres$", lines[0]).group(1))  # type: ignore[union-attr]
    assert not throwaway_pg.answers(f"postgresql://postgres@127.0.0.1:{port}/postgres")


def test_without_binaries_the_postgresql_half_is_skipped_in_one_line(tmp_path: Path) -> None:
    """With no server and no binaries, the SQLite half passes, the PostgreSQL half is skipped,
    and the summary holds one line saying why."""
    run = _pytest(tmp_path, CANARY_TEST_PG_BINDIR=str(tmp_path / "no-binaries"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^2 passed, 2 skipped", run.stdout, re.M), run.stdout
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1, run.stdout
    assert "[2]" in skips[0] and "PostgreSQL half skipped" in skips[0], skips
    assert "no local PostgreSQL binaries" in skips[0], skips


def test_ci_requires_postgresql(tmp_path: Path) -> None:
    """Under CANARY_REQUIRE_PG=1 (what .ci/run sets), the same run fails instead of skipping."""
    run = _pytest(
        tmp_path, CANARY_TEST_PG_BINDIR=str(tmp_path / "no-binaries"), CANARY_REQUIRE_PG="1"
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"^2 passed, 2 errors", run.stdout, re.M), run.stdout
    assert "CANARY_REQUIRE_PG=1 but nothing answers at" in run.stdout
