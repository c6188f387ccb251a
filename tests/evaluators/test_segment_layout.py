"""A stored segment's layout version is derived from what it stores, and a segment of another
layout is rebuilt from the rows (SQLite and PostgreSQL), never an error to the report's caller.

`evaluators.pairs.segments.LAYOUT` is a digest of the ordered (column, dtype) list of a PairSet
and of the segment's header and framing: declaring a per-pair quantity in `domain.observation`
adds columns and so changes the version, with nothing to bump by hand.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any

import msgspec
import numpy as np
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import StorageError
from domain.observation import PER_PAIR
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import segments
from evaluators.pairs.load import load_pairs
from evaluators.pairs.types import PairSet
from evaluators.report.build import evaluate
from storage.models import ReportSegmentRow
from tests.evaluators.test_eval_pairs import assert_same, register
from tests.evaluators.test_report_segments import _comparable, _traffic, _write

SEGMENTS = ReportSegmentRow.__table__


def _layout_of(ps: PairSet) -> str:
    return segments.layout_version(
        [(path, array.dtype.str) for path, array, _, _ in segments._columns(ps)]
    )


def test_the_layout_version_is_derived_from_the_stored_columns() -> None:
    """The version is the digest of the PairSet's own columns, and a column declared in a
    test-local layout (an extra per-pair quantity, another dtype, another order) changes it."""
    ps = PairSet.empty(0)
    assert segments.LAYOUT == _layout_of(ps) == segments.layout_version(segments.COLUMNS)
    # Every declared per-pair quantity is stored, for every arm: the declaration drives it.
    paths = [path for path, _ in segments.COLUMNS]
    for arm in ("production", "candidate", "control"):
        assert [f"{arm}.quantities.{name}" for name in PER_PAIR] == [
            p for p in paths if p.startswith(f"{arm}.quantities.")
        ]
    # A new measured quantity: one more float32 column per arm.
    for arm in (ps.production, ps.candidate, ps.control):
        arm.quantities["reasoning_tokens"] = np.zeros(0, np.float32)
    grown = _layout_of(ps)
    assert grown != segments.LAYOUT
    retyped = [(p, "<f8" if p == "temperature" else d) for p, d in segments.COLUMNS]
    assert retyped != segments.COLUMNS
    assert segments.layout_version(retyped) not in (segments.LAYOUT, grown)
    assert segments.layout_version(segments.COLUMNS[::-1]) != segments.LAYOUT


def test_a_segment_of_another_layout_is_refused_before_any_row_is_copied() -> None:
    """Decoding a segment whose header names another layout, lists other columns or whose
    bytes are cut raises a StorageError naming both versions, and leaves the target as it was."""
    src = PairSet.empty(4)
    src.n = 4
    src.received_at[:4] = [1.0, 2.0, 3.0, 4.0]
    good = segments.encode(src)
    dst = PairSet.empty(4)
    segments.decode_into(dst, 0, good)
    assert dst.received_at[:4].tolist() == [1.0, 2.0, 3.0, 4.0]
    for bad, found in (
        (_with_header(good, layout="0123456789abcdef"), "0123456789abcdef"),
        (_with_header(good, layout=None, format=1), segments.UNVERSIONED),
        (_with_header(good, columns=segments.COLUMNS[:-1]), segments.LAYOUT),
        (good[:-1], segments.LAYOUT),
        (b"\x00\x01", "unknown"),
    ):
        target = PairSet.empty(4)
        with pytest.raises(StorageError, match=f"layout {found}.*reads {segments.LAYOUT}"):
            segments.decode_into(target, 0, bad)
        untouched = zip(segments._columns(target), segments._columns(PairSet.empty(4)), strict=True)
        for (path, array, _, _), (_, fresh, _, _) in untouched:
            np.testing.assert_array_equal(array, fresh, err_msg=path)


def _with_header(data: bytes, **changes: Any) -> bytes:
    """The segment's bytes with header fields changed (None: the field removed)."""
    (size,) = struct.unpack_from("<I", data)
    header = msgspec.json.decode(data[4 : 4 + size])
    for key, value in changes.items():
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    head = msgspec.json.encode(header)
    return struct.pack("<I", len(head)) + head + data[4 + size :]


async def test_segments_of_another_layout_are_rebuilt_from_the_rows(
    db_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """Stored segments written under other layouts (an older digest, the typed `format` of
    before, bytes that do not decode) give the report built from the rows, logged once with
    the candidate and both versions, and are stored again under the current layout."""
    await register(db_engine)
    now = time.time()
    pairs = _traffic(now)
    await _write(db_engine, pairs, [(p, ep) for p in pairs for ep in ("live", "cand", "ctrl")])
    kw: dict[str, Any] = {"since": 0.0, "until": now, "similarity_max_pairs": 300}
    await load_pairs(db_engine, "cand", **kw)  # stores the closed spans
    async with db_engine.begin() as conn:
        stored = (await conn.execute(select(SEGMENTS.c.id, SEGMENTS.c.data))).all()
        assert len(stored) >= 8
        for i, (sid, data) in enumerate(stored):
            old = [
                _with_header(bytes(data), layout="0123456789abcdef"),
                _with_header(bytes(data), layout=None, format=1),
                b"not a segment",
            ][i % 3]
            await conn.execute(update(SEGMENTS).where(SEGMENTS.c.id == sid).values(data=old))

    with caplog.at_level(logging.WARNING, logger="canary.report"):
        fast = await load_pairs(db_engine, "cand", **kw)
    slow = await load_pairs(db_engine, "cand", **kw, segmented=False)
    assert_same(fast, slow)
    warned = [r.getMessage() for r in caplog.records if "rebuilt from the rows" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'cand'" in warned[0] and segments.LAYOUT in warned[0]
    assert "0123456789abcdef" in warned[0] or segments.UNVERSIONED in warned[0]

    # Stored again under this layout: the next report reads them and says nothing.
    async with db_engine.connect() as conn:
        rewritten = (await conn.execute(select(SEGMENTS.c.data))).scalars().all()
    assert len(rewritten) == len(stored)
    for data in rewritten:
        (size,) = struct.unpack_from("<I", data)
        assert msgspec.json.decode(bytes(data)[4 : 4 + size])["layout"] == segments.LAYOUT
    caplog.clear()
    settings = VerdictSettings().with_overrides({"similarity_max_pairs": 300})
    with caplog.at_level(logging.WARNING, logger="canary.report"):
        seg = await evaluate(db_engine, "cand", since=0.0, until=now, settings=settings)
    assert not [r for r in caplog.records if "rebuilt" in r.getMessage()]
    full = await evaluate(
        db_engine, "cand", since=0.0, until=now, settings=settings, segmented=False
    )
    assert _comparable(seg) == _comparable(full)
