"""A large report's pair columns in a file instead of the heap, paged in a metric at a time.

A PairSet is about 230 bytes a pair: 10 million pairs are 2.2 GiB of columns, while each metric
reads a handful of them. When a window's columns would exceed `Spill.over_bytes`, the assembly
(`evaluators.pairs.segments.Assembly`) lays them out in one file in `Spill.directory`, mapped
shared: the arrays are ordinary numpy arrays over that mapping. `SpillFile.release` (after the
assembly's every few spans and after each metric, `PairSet.release`) drops this process's
mapped pages; the data stays in the file and the kernel's page cache, which it can reclaim
without writing anything back once the pages are clean. So a report's resident memory is the
columns the current metric reads plus its temporaries, not the whole window.

The file is unlinked as soon as it is created: nothing is left behind by a crash, and the disk
space is returned when the last array over it is gone. It must be on a disk, not a tmpfs (the
pages of a tmpfs are memory): the default directory is the SQLite database's, else the
system's temporary directory (`report_spill_dir` in the gateway's config says otherwise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import mmap
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

_PAGE = mmap.PAGESIZE


def _libc_trim() -> Any:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_trim()


@dataclass(frozen=True, slots=True)
class Spill:
    """Where a report's columns go when they would take more than `over_bytes`."""

    directory: str
    over_bytes: int

    def wanted(self, nbytes: int) -> bool:
        return nbytes > self.over_bytes


def default_dir(db_url: str) -> str:
    """The SQLite database's directory (the disk the data is on), else the temp directory."""
    prefix = "sqlite+aiosqlite:///"
    if db_url.startswith(prefix):
        path = db_url[len(prefix) :].split("?", 1)[0]
        if path and path != ":memory:":
            return str(Path(path).resolve().parent)
    return tempfile.gettempdir()


class SpillFile:
    """One unlinked file mapped shared, carved into column arrays of known dtypes.

    Arrays are handed out without filling: the assembly writes every row of every column
    before anything reads it (a fresh file reads as zeros until then). OSError when the
    directory cannot hold it (missing, read-only, full)."""

    def __init__(self, directory: str, nbytes: int) -> None:
        fd, path = tempfile.mkstemp(prefix="canary-report-", suffix=".columns", dir=directory)
        try:
            os.unlink(path)
            size = max(_PAGE, nbytes)
            # Reserve the blocks now: a write into a mapped file the disk has no room for is a
            # SIGBUS, not an error; without room this raises OSError (ENOSPC) before anything.
            os.posix_fallocate(fd, 0, size)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)  # the mapping keeps the file; its space is freed when it is unmapped
        self._used = 0

    def array(self, n: int, dtype: Any) -> NDArray[Any]:
        """The next n elements of `dtype`, page-aligned, over the file."""
        dt = np.dtype(dtype)
        offset = self._used
        self._used = offset + -(-n * dt.itemsize // _PAGE) * _PAGE
        if self._used > len(self._map):
            raise ValueError("spill file layout larger than the file")
        return np.frombuffer(self._map, dtype=dt, count=n, offset=offset)

    def release(self) -> None:
        """Drop this process's mapped pages (the data stays in the file and page cache), and
        hand the heap's free pages back to the system (`malloc_trim`): a metric's temporaries
        of 10-80 MB are freed between metrics, but glibc keeps freed heap memory mapped, so
        without the trim the process grows by fragments of every metric's temporaries. A
        young-generation collection first: reference cycles left by a metric's statistics
        (scipy's result objects) would otherwise keep its temporaries to the next collection."""
        self._map.madvise(mmap.MADV_DONTNEED)
        gc.collect(1)
        if _malloc_trim is not None:
            _malloc_trim(0)


def file_size(n: int, dtypes: list[Any]) -> int:
    """Bytes of a SpillFile holding n elements of each dtype, each column page-aligned."""
    return sum(-(-n * np.dtype(d).itemsize // _PAGE) * _PAGE for d in dtypes)
