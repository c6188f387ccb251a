"""A spilled report's columns: kept in an unlinked file, released from memory after use, and
the heap instead when the directory cannot hold them.

The equality of a spilled report with the heap's, on stored data and both databases, is in
tests/evaluators/test_report_segments.py; here are the memory and failure claims.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from evaluators.pairs import segments, synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.spill import Spill, default_dir
from evaluators.pairs.types import PairSet
from tests.evaluators.test_eval_pairs import assert_same

MiB = 1 << 20


def _resident() -> int:
    """This process's resident bytes (file-backed pages included)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _source(n: int) -> PairSet:
    sc = synthetic.Scenario(json_fraction=0.1, missing_candidate=0.02)
    return pairset_from_pairs(synthetic.pairs(sc, n, seed=3), similarity_fraction=0.5)


def _assembled(src: PairSet, copies: int, spill: Spill | None, counted: int = 0) -> PairSet:
    """`copies` of src assembled into a window counted as `counted` pairs (0: all of them)."""
    rows = counted or src.n * copies
    whole = segments.Assembly(rows, has_control=src.has_control, spill=spill)
    for _ in range(copies):
        whole.add_set(src)
    return whole.finish(suffixes=None, lost_before=np.inf)


def test_spilled_columns_leave_memory_when_released_and_keep_their_values(
    tmp_path: Path,
) -> None:
    src = _source(2_000)
    copies = 100  # 200,000 pairs: ~46 MB of columns
    heap = _assembled(src, copies, None)
    spilled = _assembled(src, copies, Spill(str(tmp_path), over_bytes=1))
    assert heap.backing is None and spilled.backing is not None
    assert not list(tmp_path.iterdir())  # unlinked as soon as it was made
    assert_same(heap, spilled)  # and reading it all back paged it in
    before = _resident()
    spilled.release()
    dropped = before - _resident()
    assert dropped > 0.8 * spilled.nbytes, (dropped / MiB, spilled.nbytes / MiB)
    assert_same(heap, spilled)  # the values are still there, read back from the file


def test_rows_that_arrive_after_the_count_grow_the_window_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open span can hold more rows than were counted: the window grows (a new file,
    copied a slice at a time) and still equals the heap's."""
    monkeypatch.setattr(segments, "RELEASE_BYTES", 64 * segments.ROW_BYTES)  # many slices
    src = _source(1_000)
    heap = _assembled(src, 5, None)
    grown = _assembled(src, 5, Spill(str(tmp_path), over_bytes=1), counted=src.n + 7)
    assert grown.backing is not None
    assert_same(heap, grown)


def test_a_directory_that_cannot_hold_the_file_leaves_the_columns_on_the_heap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _source(500)
    missing = Spill(str(tmp_path / "no-such-directory"), over_bytes=1)
    with caplog.at_level(logging.WARNING, logger="canary.reports"):
        ps = _assembled(src, 3, missing)
    assert ps.backing is None
    assert_same(_assembled(src, 3, None), ps)
    assert "not spilled" in caplog.text and "no-such-directory" in caplog.text


def test_a_window_under_the_limit_stays_on_the_heap(tmp_path: Path) -> None:
    src = _source(500)
    ps = _assembled(src, 2, Spill(str(tmp_path), over_bytes=2 * src.n * segments.ROW_BYTES))
    assert ps.backing is None


def test_the_default_directory_is_the_databases_else_the_temp_directory(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "canary.db"
    assert default_dir(f"sqlite+aiosqlite:///{db}") == str(db.parent)
    assert default_dir(f"sqlite+aiosqlite:///{db}?mode=rwc") == str(db.parent)
    import tempfile

    assert default_dir("postgresql+asyncpg://u@h/db") == tempfile.gettempdir()
    assert default_dir("sqlite+aiosqlite:///:memory:") == tempfile.gettempdir()
