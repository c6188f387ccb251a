"""ObservationWriter: the bounded, batched path from the mirror to the database.

`put_exchange` / `put_observation` are synchronous, O(1) and never wait: they append to a queue
bounded by `queue_max` records (so a database outage costs bounded memory) and, when it is
full, drop the record and count it. One owned task drains the queue in batches — when
`batch_size` records are waiting or `flush_interval_s` has passed — with executemany-style
INSERT … ON CONFLICT DO NOTHING (duplicates are ignored, on both dialects).

While the database is unreachable the batch in hand is retried with capped exponential backoff
and jitter; it is never lost, and the queue keeps absorbing (then dropping and counting). A
batch the database rejects for its content is retried row by row, and only the offending rows
are dropped (counted as `rows_rejected`). `close()` flushes what is queued, within a deadline.

As a guard it enforces again what the mirror already does: output text cut to
`store_text_max_chars` (hash of the full text kept), or with `store_text=False` no text at all —
only its hash, and tool-call arguments replaced by theirs. It never logs record contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.exposition import Family, Kind, Sample
from domain.records import ExchangeRecord, ObservationRecord
from storage.sql import EXCHANGES, OBSERVATIONS, insert_ignore, is_transient
from storage.textguard import exchange_row, observation_row

logger = logging.getLogger(__name__)

Row = dict[str, Any]

_CHUNK: Final = 100

_STAT_KEYS: Final = (
    "queue_depth",
    "written_exchanges",
    "written_observations",
    "observations_dropped",
    "exchanges_dropped",
    "rows_rejected",
    "batches",
    "retries",
    "db_errors",
)
_HELP: Final[dict[str, tuple[Kind, str]]] = {
    "queue_depth": ("gauge", "Records waiting to be written."),
    "written_exchanges": ("counter", "Exchange records written (duplicates ignored)."),
    "written_observations": ("counter", "Observation records written (duplicates ignored)."),
    "observations_dropped": ("counter", "Observations dropped: queue full or shutdown deadline."),
    "exchanges_dropped": ("counter", "Exchanges dropped: queue full or shutdown deadline."),
    "rows_rejected": ("counter", "Records the database refused for their content."),
    "batches": ("counter", "Batches committed."),
    "retries": ("counter", "Batch retries while the database was unavailable."),
    "db_errors": ("counter", "Failed database writes, transient or not."),
}
# One family per stat: counters end in _total.
FAMILIES: Final = {
    key: Family(f"canary_writer_{key}" + ("_total" if kind == "counter" else ""), kind, text)
    for key, (kind, text) in _HELP.items()
}


class ObservationWriter:
    """Implements gateway.server.hooks.ObservationSink structurally; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        batch_size: int,
        flush_interval_s: float,
        queue_max: int,
        store_text: bool,
        store_text_max_chars: int,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 5.0,
    ) -> None:
        self._engine = engine
        self._batch_size = max(1, batch_size)
        self._flush_interval_s = flush_interval_s
        # Bounds the memory a database outage can cost; beyond it records are dropped, counted.
        self._queue_max = queue_max
        self._store_text = store_text
        self._max_chars = store_text_max_chars
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._exchanges: deque[ExchangeRecord] = deque()
        self._observations: deque[ObservationRecord] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._in_flight = (0, 0)  # (exchanges, observations) taken off the queue, not yet written
        self._outage = False
        self._counts = dict.fromkeys(_STAT_KEYS, 0)
        dialect = engine.dialect.name
        self._insert_exchanges = insert_ignore(dialect, EXCHANGES)
        self._insert_observations = insert_ignore(dialect, OBSERVATIONS)

    # ---- the sink: called on the request path, never waits
    def put_exchange(self, record: ExchangeRecord) -> None:
        if self._closing or self._depth() >= self._queue_max:
            self._counts["exchanges_dropped"] += 1
            return
        self._exchanges.append(record)
        if self._depth() >= self._batch_size:
            self._wake.set()

    def put_observation(self, record: ObservationRecord) -> None:
        if self._closing or self._depth() >= self._queue_max:
            self._counts["observations_dropped"] += 1
            return
        self._observations.append(record)
        if self._depth() >= self._batch_size:
            self._wake.set()

    def _depth(self) -> int:
        return len(self._exchanges) + len(self._observations)

    # ---- lifecycle
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="observation-writer")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting records, write what is queued, and return within `timeout_s`; what
        could not be written by then is counted as dropped."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            self._count_lost()
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            logger.warning("observation writer: shutdown deadline passed; dropping the rest")
        finally:  # also when close() itself is cancelled: never leave the task behind
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._count_lost()

    def _count_lost(self) -> None:
        ex, obs = self._in_flight
        self._counts["exchanges_dropped"] += ex + len(self._exchanges)
        self._counts["observations_dropped"] += obs + len(self._observations)
        self._exchanges.clear()
        self._observations.clear()
        self._in_flight = (0, 0)

    # ---- numbers
    def stats(self) -> dict[str, int]:
        out = dict(self._counts)
        out["queue_depth"] = self._depth() + sum(self._in_flight)
        return out

    def prometheus_lines(self) -> Iterable[Sample]:
        stats = self.stats()
        for key in _STAT_KEYS:
            yield FAMILIES[key].sample(stats[key])

    # ---- the drain task
    async def _run(self) -> None:
        while True:
            if self._depth() < self._batch_size and not self._closing:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._flush_interval_s):
                        await self._wake.wait()
            if not self._depth():
                if self._closing:
                    return
                continue
            try:
                await self._write_batch()
            except Exception:
                # A bug (say, a record that cannot be converted) must not end the drain task:
                # the queue would fill and silently drop everything after it.
                logger.exception("observation writer: batch failed; its records are dropped")
                self._counts["rows_rejected"] += sum(self._in_flight)
                self._in_flight = (0, 0)

    async def _take(self) -> tuple[list[Row], list[Row]]:
        room = self._batch_size
        ex_records = list(_pop(self._exchanges, room))
        obs_records = list(_pop(self._observations, room - len(ex_records)))
        self._in_flight = (len(ex_records), len(obs_records))
        ex = await self._convert(ex_records, exchange_row)
        obs = await self._convert(obs_records, self._observation_row)
        self._in_flight = (len(ex), len(obs))
        return ex, obs

    def _observation_row(self, record: ObservationRecord) -> Row:
        return observation_row(record, store_text=self._store_text, max_chars=self._max_chars)

    async def _convert(self, records: list[Any], convert: Callable[[Any], Row]) -> list[Row]:
        rows: list[Row] = []
        for n, record in enumerate(records, 1):
            try:
                rows.append(convert(record))
            except Exception:  # a malformed record (wrong types) costs itself only
                self._counts["rows_rejected"] += 1
                logger.warning("observation writer: dropped a malformed %s", type(record).__name__)
            if not n % _CHUNK:
                await asyncio.sleep(0)  # let the proxy run between chunks
        return rows

    async def _write_batch(self) -> None:
        ex, obs = await self._take()
        delay, ceiling = self._backoff
        singly = False
        while ex or obs:
            try:
                if singly:
                    await self._write_singly(ex, obs)
                else:
                    await self._write(ex, obs)
                    self._written(len(ex), len(obs))
                    ex.clear()
                    obs.clear()
            except Exception as exc:
                self._counts["db_errors"] += 1
                if not await self._is_outage(exc):
                    if not singly:
                        logger.warning(
                            "observation writer: a batch was refused (%s); writing it row by row",
                            type(exc).__name__,
                        )
                    singly = True
                    continue
                if not self._outage:
                    self._outage = True
                    logger.warning(
                        "observation writer: database unavailable (%s); retrying with backoff, "
                        "queue bounded at %d records",
                        _first_line(exc),
                        self._queue_max,
                    )
                self._counts["retries"] += 1
                await asyncio.sleep(delay * (0.5 + random.random()))  # jitter: replicas desync
                delay = min(delay * 2, ceiling)
            else:
                if self._outage:
                    self._outage = False
                    logger.info("observation writer: database reachable again")
        self._in_flight = (0, 0)

    async def _write(self, ex: list[Row], obs: list[Row]) -> None:
        async with self._engine.begin() as conn:
            # Statements of at most _CHUNK rows: parameter processing runs on the event loop,
            # and the proxy shares it; one transaction per batch all the same.
            for stmt, rows in ((self._insert_exchanges, ex), (self._insert_observations, obs)):
                for start in range(0, len(rows), _CHUNK):
                    await conn.execute(stmt, rows[start : start + _CHUNK])
        self._counts["batches"] += 1

    async def _write_singly(self, ex: list[Row], obs: list[Row]) -> None:
        """Write rows one transaction each; drop (and count) the ones refused for their content.
        A transient error propagates with the unwritten rows still in the lists."""
        for rows, stmt, is_exchange in (
            (ex, self._insert_exchanges, True),
            (obs, self._insert_observations, False),
        ):
            while rows:
                try:
                    await self._write_one(stmt, rows[0])
                except Exception as exc:
                    if await self._is_outage(exc):
                        raise
                    self._counts["db_errors"] += 1
                    self._counts["rows_rejected"] += 1
                    # The type only: a driver's message may quote the row's values.
                    logger.warning(
                        "observation writer: dropped a %s row the database refused (%s)",
                        "exchange" if is_exchange else "observation",
                        type(getattr(exc, "orig", None) or exc).__name__,
                    )
                else:
                    self._written(int(is_exchange), int(not is_exchange))
                rows.pop(0)
                self._in_flight = (len(ex), len(obs))

    async def _is_outage(self, exc: Exception) -> bool:
        """Whether `exc` means "the database is unavailable" rather than "this data is refused".
        Error classes alone cannot tell (a refused connection and a refused value can both be a
        bare DBAPIError), so a non-transient-looking error is confirmed with a trivial query."""
        if is_transient(exc):
            return True
        try:
            async with self._engine.connect() as conn:
                await conn.execute(select(1))
        except Exception:
            return True
        return False

    async def _write_one(self, stmt: Any, row: Row) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(stmt, [row])

    def _written(self, exchanges: int, observations: int) -> None:
        self._counts["written_exchanges"] += exchanges
        self._counts["written_observations"] += observations


def _pop(queue: deque[Any], n: int) -> Iterator[Any]:
    for _ in range(min(n, len(queue))):
        yield queue.popleft()


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return (text.splitlines() or [type(exc).__name__])[0][:200]
