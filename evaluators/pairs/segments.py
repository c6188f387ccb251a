"""A PairSet in spans of arrival time, stored as bytes: how a report over millions of pairs reads
columns instead of joining and converting millions of rows.

The pairs of a window are cut on a fixed grid of GRID_S seconds of arrival time (plus the
partial span from the window's start to the first grid line, and the open span at its end,
which is always read from the rows). Each closed span's pairs are built exactly as the full
load builds them (`evaluators.pairs.columns.PairSetBuilder`, the same query restricted to the
span) and stored as the PairSet's columns, raw (`encode`). A report concatenates the spans in
order and then does what depends on the whole window, never on one span:

- the similarity sample: its size depends on the window's number of pairs. A span is built
  with the sample its own number of pairs would take, which is never smaller than any window
  holding it would take, and the assembled set drops the similarity of the pairs ranked past
  the window's sample size (`PairSet.sample_rank`);
- lost versus pending copies (against the candidate's current timeout);
- split sessions (a session is split by its turns in any span);
- the model and replica codes (renumbered in order of first appearance, as one load would).

So the assembled PairSet is equal, column for column, to the one a single load over the window
builds; tests/evaluators/test_report_segments.py compares them.

The stored layout's version (`LAYOUT`) is derived, never typed: a digest of the ordered (column,
dtype) list a segment stores and of the header and framing around them. Declaring a per-pair
quantity (`domain.observation`) adds columns and so changes it. Reading a stored segment of
another layout, other columns, or bytes that do not decode raises a `StorageError` naming both
versions, and the loader rebuilds that span from the rows and stores it again. A column whose
meaning changes under the same name and dtype takes a new name (a digest cannot see meaning).
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import fields
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from domain.errors import StorageError
from evaluators.pairs.columns import mark_split, sample_fraction, sample_size
from evaluators.pairs.spill import Spill, SpillFile, file_size
from evaluators.pairs.types import ArmColumns, Comparison, PairSet

log = logging.getLogger("canary.reports")

# Grid of the spans, in seconds of arrival time. A power of two, so a grid line is an exact
# float and `floor(t / GRID_S)` (what the database counts by) agrees with `t >= k * GRID_S`
# (what the span's query selects by). About a minute: at 100 pairs/s a span holds 6,400 pairs
# (1.4 MB of columns), the open span read from the rows at every report stays small, and a
# million pairs are ~160 spans.
GRID_S = 64.0


def params(max_chars: int) -> str:
    """The inputs a span's columns depend on besides the rows (stored segments match on it).
    The layout is not one of them: it is in each segment's header, checked when it is read, so
    a segment of an older layout is found, replaced in place, and said so."""
    return f"chars={max_chars}"


def plan(since: float, until: float) -> tuple[tuple[float, float] | None, float, float]:
    """(head, first grid line, last grid line) of the window [since, until): the head span
    [since, first line) when the window does not start on a grid line and reaches that line
    (None otherwise), and the grid lines between which whole cells lie. The open span is
    [last line, until) (empty when until is on a line)."""
    first = math.ceil(since / GRID_S) * GRID_S
    last = math.floor(until / GRID_S) * GRID_S
    if first > last:  # the window lies inside one cell: everything is the open span
        return None, since, since
    head = (since, first) if first > since else None
    return head, first, last


def cell_span(cell: int) -> tuple[float, float]:
    return cell * GRID_S, (cell + 1) * GRID_S


def cell_of(t: float) -> int:
    return math.floor(t / GRID_S)


def _columns(
    obj: PairSet | ArmColumns | Comparison, prefix: str = ""
) -> Iterator[tuple[str, NDArray[Any], Any, str]]:
    """Every array column (path, array, owner, attribute or key), in declaration order."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            yield prefix + f.name, value, obj, f.name
        elif isinstance(value, dict):
            for key, column in value.items():
                yield f"{prefix}{f.name}.{key}", column, value, key
        elif isinstance(value, ArmColumns | Comparison):
            yield from _columns(value, f"{prefix}{f.name}.")


# A header written before the layout was derived (they carried a typed `format`) has none.
UNVERSIONED = "unversioned"


class _Header(msgspec.Struct, frozen=True):
    n: int
    has_control: bool
    models: list[str]
    replicas: list[str]
    columns: list[tuple[str, str]]  # (path, numpy dtype)
    layout: str = UNVERSIONED


# How a segment is framed: a little-endian u32 header length, the msgspec JSON header, then each
# column's rows raw, in `columns` order. Part of the layout's digest.
_FRAMING = "u32le-length json-header raw-columns"


def layout_version(columns: Iterable[tuple[str, str]]) -> str:
    """The version of a layout storing these (column, numpy dtype) pairs, in order: a digest of
    them, the header's fields and the framing. Any change of one changes it."""
    spec = [_FRAMING, list(_Header.__struct_fields__), [list(c) for c in columns]]
    return hashlib.sha256(msgspec.json.encode(spec)).hexdigest()[:16]


# What a segment stores, in order, and its version: derived from the PairSet's declaration.
COLUMNS = [(path, array.dtype.str) for path, array, _, _ in _columns(PairSet.empty(0))]
LAYOUT = layout_version(COLUMNS)


def _unreadable(found: str, reason: str) -> StorageError:
    """A stored segment this code cannot read: another layout, other columns, or bytes that do
    not decode. Never reaches a report's caller: the loader rebuilds the span from the rows."""
    return StorageError(f"stored under layout {found}, this code reads {LAYOUT} ({reason})")


def encode(ps: PairSet) -> bytes:
    """The PairSet's first `ps.n` rows as bytes: a JSON header, then each column raw."""
    n = ps.n
    cols = list(_columns(ps))
    header = _Header(
        n,
        ps.has_control,
        list(ps.models),
        list(ps.replicas),
        [(path, array.dtype.str) for path, array, _, _ in cols],
        LAYOUT,
    )
    head = msgspec.json.encode(header)
    parts = [struct.pack("<I", len(head)), head]
    parts += [np.ascontiguousarray(array[:n]).tobytes() for _, array, _, _ in cols]
    return b"".join(parts)


class Decoded(msgspec.Struct):
    n: int
    models: list[str]
    replicas: list[str]


def _header(data: bytes) -> tuple[_Header, int]:
    """A segment's header and where its columns start; StorageError when it is not one
    this code reads (checked whole before any row is copied)."""
    try:
        (size,) = struct.unpack_from("<I", data)
        header = msgspec.json.decode(data[4 : 4 + size], type=_Header)
    except (struct.error, msgspec.DecodeError) as exc:
        raise _unreadable("unknown", f"header does not decode: {exc}") from exc
    if header.layout != LAYOUT:
        raise _unreadable(header.layout, "another layout")
    if [tuple(c) for c in header.columns] != COLUMNS:
        raise _unreadable(header.layout, "columns differ from the PairSet's")
    if len(data) != 4 + size + header.n * ROW_BYTES:
        raise _unreadable(header.layout, f"{len(data)} bytes for {header.n} rows")
    return header, 4 + size


def decode_into(dst: PairSet, start: int, data: bytes) -> Decoded:
    """Copy an encoded span's columns into dst's rows [start, start + n); a StorageError
    (nothing copied) when the bytes are not a segment of this layout."""
    header, offset = _header(data)
    n = header.n
    for (_, array, _, _), (_, dtype) in zip(_columns(dst), COLUMNS, strict=True):
        array[start : start + n] = np.frombuffer(data, np.dtype(dtype), n, offset)
        offset += n * array.dtype.itemsize
    return Decoded(n, header.models, header.replicas)


def copy_into(dst: PairSet, start: int, src: PairSet) -> Decoded:
    """Copy src's rows into dst's rows [start, start + src.n)."""
    n = src.n
    for (_, array, _, _), (_, source, _, _) in zip(_columns(dst), _columns(src), strict=True):
        array[start : start + n] = source[:n]
    return Decoded(n, list(src.models), list(src.replicas))


# A spilled assembly releases its written pages every this many bytes of rows: each release
# walks the whole mapping, so not after every span (1,500 of them at ten million pairs).
RELEASE_BYTES = 64 << 20
# Bytes of columns per pair (every column of a PairSet, one row).
ROW_BYTES = sum(np.dtype(dtype).itemsize for _, dtype in COLUMNS)


def spilled(rows: int, spill: Spill) -> PairSet:
    """An empty PairSet with room for `rows`, its columns in a file (`evaluators.pairs.spill`).
    Its rows are not filled: each must be written (whole spans are) before it is read."""
    ps = PairSet.empty(0)
    cols = list(_columns(ps))
    backing = SpillFile(spill.directory, file_size(rows, [a.dtype for _, a, _, _ in cols]))
    for _, array, owner, key in cols:
        column = backing.array(rows, array.dtype)
        if isinstance(owner, dict):
            owner[key] = column
        else:
            setattr(owner, key, column)
    ps.backing = backing
    return ps


class Assembly:
    """Concatenates spans (in arrival order) into one preallocated PairSet: on the heap, or
    in a spill file when the window's columns would take more than `spill.over_bytes`."""

    def __init__(self, total: int, *, has_control: bool, spill: Spill | None = None) -> None:
        self._spill = spill if spill is not None and spill.wanted(total * ROW_BYTES) else None
        self.ps = self._empty(total)
        self.ps.has_control = has_control
        self._models: dict[str, int] = {}
        self._replicas: dict[str, int] = {}
        self._unreleased = 0  # bytes of rows written since the last release

    def _empty(self, rows: int) -> PairSet:
        if self._spill is not None:
            try:
                return spilled(rows, self._spill)
            except OSError as exc:  # no room or no such directory: the heap, as without it
                log.warning(
                    "report columns not spilled to %s (%s): %s MB on the heap",
                    self._spill.directory,
                    exc,
                    rows * ROW_BYTES // 1_000_000,
                )
                self._spill = None
        return PairSet.empty(rows)

    def add_bytes(self, data: bytes, rows: int) -> int:
        self._room(rows)
        return self._added(self._renumber(decode_into(self.ps, self.ps.n, data)))

    def add_set(self, src: PairSet) -> int:
        self._room(src.n)
        return self._added(self._renumber(copy_into(self.ps, self.ps.n, src)))

    def _added(self, rows: int) -> int:
        """A spilled window's written pages leave this process every RELEASE_BYTES of rows."""
        self._unreleased += rows * ROW_BYTES
        if self._unreleased >= RELEASE_BYTES:
            self.ps.release()
            self._unreleased = 0
        return rows

    def _room(self, rows: int) -> None:
        """Rows can arrive between counting and reading the open span: grow to fit them."""
        if self.ps.n + rows > self.ps.capacity:
            old, n = self.ps, self.ps.n
            self.ps = self._empty(max(n + rows, old.capacity + old.capacity // 8))
            step = max(1, RELEASE_BYTES // ROW_BYTES)
            for lo in range(0, n, step):  # a spilled window holds a slice of each at a time
                hi = min(n, lo + step)
                pairs = zip(_columns(self.ps), _columns(old), strict=True)
                for (_, array, _, _), (_, source, _, _) in pairs:
                    array[lo:hi] = source[lo:hi]
                self.ps.release()
                old.release()
            self.ps.n = n
            self.ps.has_control = old.has_control

    def _renumber(self, got: Decoded) -> int:
        """Codes local to the span become the window's (first appearance first)."""
        sl = slice(self.ps.n, self.ps.n + got.n)
        for column, names, codes in (
            (self.ps.model, got.models, self._models),
            (self.ps.replica, got.replicas, self._replicas),
        ):
            if not names:
                continue
            used = np.zeros(len(names), dtype=bool)
            used[np.unique(column[sl])] = True
            remap = np.zeros(len(names), dtype=np.int16)
            for local, name in enumerate(names):
                if used[local]:  # a code is only assigned to a name that appears
                    remap[local] = codes.setdefault(name, len(codes))
            column[sl] = remap[column[sl]]
        self.ps.n += got.n
        return got.n

    def finish(self, *, suffixes: tuple[str, ...] | None, lost_before: float) -> PairSet:
        """The window's PairSet: the similarity sample cut to the window's size, lost and
        pending copies counted against `lost_before`, split sessions marked."""
        ps = self.ps
        n = ps.n
        if n != ps.capacity:
            ps = ps.head(n)
        outside = ps.sample_rank[:n] >= sample_size(suffixes)
        ps.vs_candidate.similarity[:n][outside] = np.nan
        ps.vs_control.similarity[:n][outside] = np.nan
        ps.similarity_fraction = sample_fraction(suffixes)
        missing = ~ps.candidate.present[:n]
        late = ps.received_at[:n] >= lost_before
        ps.lost = int(np.count_nonzero(missing & ~late))
        ps.pending = int(np.count_nonzero(missing & late))
        ps.models = sorted(self._models, key=self._models.__getitem__)
        ps.replicas = sorted(self._replicas, key=self._replicas.__getitem__)
        mark_split(ps)
        ps.release()
        return ps
