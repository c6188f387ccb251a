"""Load aligned (production, candidate[, control]) observations from storage: the evaluators' IO.

The only evaluator module that reads the database, and only through `storage.reports` (which
holds every query; this module imports no SQLAlchemy and no driver). One streaming query
(`storage.reports.pairs.window_rows`, read in partitions of `batch_size`) joins each exchange
of a span to production's observation, the candidate's and the control's; rows go straight
into the compact columns of a `PairSet` (about 230 bytes per pair), so memory stays flat
whatever the number of rows. A report reads the closed spans of its window from their stored
segments (`evaluators.pairs.segments`) and runs that query only for the spans that are missing,
stale, stored under another layout, or still open.

Texts are only fetched where they can matter: when two arms' output hashes differ or are
unknown (divergence, similarity, exact match) or the request asked for JSON.

Split sessions: a session whose pairs were stored by more than one gateway replica
(`exchanges.replica`, the host's mirror process) is marked in `PairSet.split` over the whole
window (`columns.mark_split`); its turns could reach the candidate out of order or at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

import numpy as np

from domain.accounting import ACCOUNTING_KEYS, STALE_REPLICAS
from domain.capture import CapacitySummary
from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, ReportTooLarge, StorageError
from evaluators.human.data import HumanLabels
from evaluators.pairs import segments
from evaluators.pairs.columns import (
    ARM_FIELDS,
    PAIR_FIELDS,
    PRODUCTION_UNUSED_WITH_CONTROL,
    PairSetBuilder,
    mark_split,
    sample_size,
    sample_suffixes,
)
from evaluators.pairs.gradings import COLUMNS as GRADING_COLUMNS
from evaluators.pairs.gradings import Gradings, pair_accounting
from evaluators.pairs.segments import Assembly
from evaluators.pairs.spill import Spill
from evaluators.pairs.types import PairSet, ProgressFactory
from storage.reports import gradings as grading_store
from storage.reports import labels as label_store
from storage.reports import pairs as store
from storage.reports import segments as seg_store
from storage.reports.pairs import RowLayout

log = logging.getLogger("canary.report")

# The store the loader reads (`storage.engine.make_engine` builds it); its callers name its type
# from here, without importing SQLAlchemy.
Engine: TypeAlias = store.Engine


async def load_endpoints(
    engine: Engine, candidate: str
) -> tuple[Endpoint, Endpoint | None, Endpoint | None]:
    """(candidate, live endpoint, control) — EndpointNotFound when the candidate does not exist.

    The control is the most recently updated active endpoint of kind "control" other than the
    candidate itself (so a control's own report compares it with production).
    """
    endpoints = await store.endpoints(engine)
    by_name = {ep.name: ep for ep in endpoints}
    if candidate not in by_name:
        raise EndpointNotFound(candidate, f"no candidate named {candidate!r}")
    live = next((ep for ep in endpoints if ep.role == "live"), None)
    controls = [
        ep
        for ep in endpoints
        if ep.kind == "control" and ep.name != candidate and ep.role == "candidate"
    ]
    controls.sort(key=lambda ep: (ep.state == "active", ep.updated_at), reverse=True)
    return by_name[candidate], live, controls[0] if controls else None


async def load_accounting(
    engine: Engine, candidate: str, *, now: float | None = None
) -> dict[str, int]:
    """The candidate's copy accounting: each counter summed over every replica's snapshot, and
    `stale_replicas`, how many replicas' counters lag the exchanges they stored (then the
    counters under-count and the report must not trust them for coverage)."""
    totals = dict.fromkeys(ACCOUNTING_KEYS, 0)
    totals.update(await store.counters(engine, candidate, now=now))
    totals[STALE_REPLICAS] = await store.stale_replicas(engine, candidate, now=now)
    return totals


# The row layout the builder reads (`evaluators.pairs.columns`): the query selects it in order.
_LAYOUT = RowLayout(
    exchange=PAIR_FIELDS,
    arm=ARM_FIELDS,
    unused_by_production_with_control=PRODUCTION_UNUSED_WITH_CONTROL,
)


async def load_tool_errors(
    engine: Engine, candidate: str, *, since: float | None = None, until: float | None = None
) -> list[tuple[str, int]]:
    """The candidate's most frequent first tool-call problems in the window, with counts."""
    return await store.tool_errors(engine, candidate, since=since, until=until)


async def count_pairs(
    engine: Engine, candidate: str, *, since: float | None = None, until: float | None = None
) -> int:
    """How many rows load_pairs will read for the candidate in the window."""
    return await store.count_pairs(engine, candidate, since=since, until=until)


async def load_pairs(
    engine: Engine,
    candidate: str,
    *,
    since: float | None = None,
    until: float | None = None,
    batch_size: int = 5000,
    progress: ProgressFactory | None = None,
    control: str | bool | None = True,
    similarity_max_pairs: int = 10_000,
    max_chars: int = 4000,
    segmented: bool = True,
    max_pairs: int | None = None,
    spill: Spill | None = None,
) -> PairSet:
    """Aligned pairs of `candidate` received in [since, until), in arrival order.

    The rows are the exchanges whose copy the candidate's ring accepted (`exchanges.targets`)
    or that the candidate observed; an accepted copy without an observation is lost.

    `since` defaults to the candidate's creation (earlier exchanges were never mirrored to it),
    `until` to now. `control`: True finds the control (kind "control"), a name uses that one,
    False/None uses none. `progress`, given the number of exchanges to go through, returns a
    callback for each part read and a function that closes the display.
    Exchanges without a candidate observation younger than the candidate's timeout are
    "pending", older ones "lost". EndpointNotFound when the candidate does not exist.

    `segmented` (the default) reads the window's closed spans from their stored columns and
    stores the spans it had to build (`evaluators.pairs.segments`); False builds the whole
    window from the rows in one pass. Both give the same PairSet.

    `max_pairs`: `domain.errors.ReportTooLarge` when the window holds more pairs than that,
    checked on counts before the window's columns are allocated or read (stored segments may
    be brought up to date first: that holds one span at a time).

    `spill`: a segmented window whose columns would take more than `spill.over_bytes` is
    assembled in a file there (`evaluators.pairs.spill`) instead of on the heap.
    """
    cand, _live, found = await load_endpoints(engine, candidate)
    control_name = (found.name if found else None) if control is True else (control or None)
    if since is None:
        since = cand.created_at or None
    end = until if until is not None else time.time()
    # Whether a copy may still answer is a question about now, not about the window's end: a
    # copy of a window long past that never answered is lost (an `until` in the future, as a
    # synthetic clock gives, keeps its own).
    lost_before = max(end, time.time()) - cand.timeout_s
    window = _Window(
        engine, candidate, control_name, max_chars, similarity_max_pairs, lost_before, batch_size
    )
    if segmented:
        return await window.by_segments(since or 0.0, end, until, progress, max_pairs, spill)
    total = await count_pairs(engine, candidate, since=since, until=until)
    _check_size(total, max_pairs)
    on_part, close = progress(total) if progress is not None else (None, _nothing)
    try:
        suffixes = sample_suffixes(similarity_max_pairs / max(1, total))
        ps = await window.build(since, until, suffixes, total, on_part)
    finally:
        close()
    mark_split(ps)
    return ps


async def load_gradings(
    engine: Engine, endpoint: str, *, since: float | None = None, until: float | None = None
) -> Gradings:
    """The LLM grader's verdicts of `endpoint` for exchanges received in [since, until), and
    every complete pair of that window by what became of it (graded, or why not)."""
    rows = await grading_store.grading_rows(
        engine, endpoint, GRADING_COLUMNS, since=since, until=until
    )
    groups = await grading_store.pair_outcomes(engine, endpoint, since=since, until=until)
    return Gradings.from_rows(rows, pair_accounting(groups))


async def load_labels(
    engine: Engine,
    endpoint: str,
    rate: float,
    *,
    since: float | None = None,
    until: float | None = None,
) -> HumanLabels | None:
    """People's labels of `endpoint`, keyed by its gradings' pair codes (`load_gradings`'s
    order over the same window); None when no pair was kept for labelling nor labelled."""
    kept = await label_store.kept_ids(engine, endpoint)
    records = await label_store.labels_of(engine, endpoint)
    if not kept and not records:
        return None
    rows = await grading_store.grading_rows(
        engine, endpoint, ("exchange_id",), since=since, until=until
    )
    ids = list(dict.fromkeys(r[0] for r in rows))
    return HumanLabels.from_rows(rate, ids, kept, records)


def _nothing() -> None:
    pass


def _check_size(pairs: int, limit: int | None) -> None:
    if limit is not None and pairs > limit:
        raise ReportTooLarge.of(pairs, limit)


async def refresh_segments(
    engine: Engine,
    candidate: str,
    *,
    similarity_max_pairs: int = 10_000,
    max_chars: int = 4000,
) -> int:
    """Bring the candidate's stored segments up to date (its default window: from its
    creation to now, with its control) without assembling a report; returns how many spans
    were built. The report process runs this in the background so a report finds them ready.
    EndpointNotFound when the candidate does not exist."""
    cand, _live, found = await load_endpoints(engine, candidate)
    now = time.time()
    window = _Window(
        engine,
        candidate,
        found.name if found else None,
        max_chars,
        similarity_max_pairs,
        now - cand.timeout_s,
        5000,
    )
    since = cand.created_at or 0.0
    head, first, last = segments.plan(since, now)
    _, built = await window.refresh(await window.spans(head, first, last), since, last)
    return built


class _Window:
    """One candidate's pairs in a window: built from the rows, or assembled from segments."""

    def __init__(
        self,
        engine: Engine,
        candidate: str,
        control: str | None,
        max_chars: int,
        similarity_max_pairs: int,
        lost_before: float,
        batch_size: int,
    ) -> None:
        self.engine = engine
        self.candidate = candidate
        self.control = control
        self.max_chars = max_chars
        self.similarity_max_pairs = similarity_max_pairs
        self.lost_before = lost_before
        self.batch_size = batch_size
        self.read_only = False  # set when the store refused to keep a segment
        self.unreadable = 0  # stored segments of another layout rebuilt from the rows

    async def build(
        self,
        since: float | None,
        until: float | None,
        suffixes: tuple[str, ...] | None,
        total: int,
        progress: Callable[[int], None] | None = None,
    ) -> PairSet:
        """The PairSet of [since, until) built from the rows (split sessions not marked)."""
        builder = PairSetBuilder(
            total,
            has_control=self.control is not None,
            suffixes=suffixes,
            max_chars=self.max_chars,
            lost_before=self.lost_before,
        )
        rows = store.window_rows(
            self.engine,
            _LAYOUT,
            self.candidate,
            control=self.control,
            since=since,
            until=until,
            suffixes=suffixes,
            batch_size=self.batch_size,
        )
        # The next batch is fetched while this one is converted: the driver's thread
        # (aiosqlite) or socket (asyncpg) works while numpy does. At most one batch waits:
        # memory stays flat. Converting runs in a worker thread so a report read inside a
        # running process never holds its event loop for a whole batch.
        async with contextlib.aclosing(rows) as batches, asyncio.TaskGroup() as tasks:
            ahead = tasks.create_task(anext(batches, None))
            while part := await ahead:
                ahead = tasks.create_task(anext(batches, None))
                await asyncio.to_thread(builder.add, part)
                if progress is not None:
                    progress(len(part))
        return builder.finish()

    async def by_segments(
        self,
        since: float,
        end: float,
        until: float | None,
        progress: ProgressFactory | None,
        max_pairs: int | None = None,
        spill: Spill | None = None,
    ) -> PairSet:
        """The window's PairSet from stored segments, building and storing the missing or
        stale ones first. The grid stops at `end` (the window's end, or now); the open span
        after the last grid line is built from the rows, up to `until` (None: whatever is
        stored, as a replica whose clock runs ahead may store exchanges "after" now)."""
        head, first, last = segments.plan(since, end)
        spans = await self.spans(head, first, last)
        open_n = await seg_store.exchange_count(self.engine, last, until)
        on_part, close = (
            progress(sum(n for _, n in spans) + open_n) if progress else (None, _nothing)
        )
        try:
            metas, _ = await self.refresh(spans, since, last, on_part)
            open_rows = await count_pairs(self.engine, self.candidate, since=last, until=until)
            # Spans with no stored segment (a store that refuses writes, a lost race) are
            # counted from the rows: the similarity sample depends on the window's total.
            rows = {
                span: metas[span].rows
                if span in metas
                else await count_pairs(self.engine, self.candidate, since=span[0], until=span[1])
                for span, _ in spans
            }
            total = sum(rows.values()) + open_rows
            _check_size(total, max_pairs)  # before the window's columns are allocated
            suffixes = sample_suffixes(self.similarity_max_pairs / max(1, total))
            whole = Assembly(total, has_control=self.control is not None, spill=spill)
            await self._assemble(whole, spans, metas, rows, suffixes)
            if open_rows:
                whole.add_set(await self.build(last, until, suffixes, open_rows))
            if on_part is not None:
                on_part(open_n)
        finally:
            close()
        return whole.finish(suffixes=suffixes, lost_before=self.lost_before)

    async def spans(
        self, head: tuple[float, float] | None, first: float, last: float
    ) -> list[tuple[tuple[float, float], int]]:
        """The closed spans holding exchanges, in order, with how many exchanges each holds."""
        spans: list[tuple[tuple[float, float], int]] = []
        if head is not None:
            spans.append((head, await seg_store.exchange_count(self.engine, *head)))
        counts = await seg_store.exchange_counts(self.engine, segments.GRID_S, first, last)
        spans += [(segments.cell_span(cell), counts[cell]) for cell in sorted(counts)]
        return [(span, n) for span, n in spans if n]

    async def refresh(
        self,
        spans: list[tuple[tuple[float, float], int]],
        since: float,
        last: float,
        on_part: Callable[[int], None] | None = None,
    ) -> tuple[dict[tuple[float, float], seg_store.SegmentMeta], int]:
        """Check the stored segments of these spans, rebuild the missing and stale ones, and
        return the stored segments (by span) as they now are, and how many were built."""
        engine, key = self.engine, self._key()
        watermark = await seg_store.max_observation_id(engine)
        stored = await self._stored(key, since, last)
        reuse = [m for span, n in spans if (m := stored.get(span)) and m.exchanges == n]
        floor = min([m.watermark for m in reuse], default=watermark)
        above = max(0, min(floor, watermark) - seg_store.RECHECK_IDS)
        recent = await self._recent(above, since, last)
        valid = {
            (m.starts_at, m.ends_at)
            for m in reuse
            if recent(m.starts_at, m.ends_at, m.watermark) == m.recent
        }
        checked = [
            (m.id, watermark, recent(m.starts_at, m.ends_at, watermark))
            for m in reuse
            if (m.starts_at, m.ends_at) in valid
        ]
        await self._writing(seg_store.advance(engine, checked))
        before = 0  # the window's pairs before the span
        built = 0
        for span, n in spans:
            if span in valid:
                before += stored[span].rows
            elif self.read_only:  # the assembly builds it from the rows
                continue
            else:
                rec = recent(*span, watermark)
                before += await self._store(key, span, n, watermark, rec, before)
                built += 1
            if on_part is not None:
                on_part(n)
        return (await self._stored(key, since, last) if built else stored), built

    def _key(self) -> tuple[str, str, str]:
        return self.candidate, self.control or "", segments.params(self.max_chars)

    async def _stored(
        self, key: tuple[str, str, str], since: float, until: float
    ) -> dict[tuple[float, float], seg_store.SegmentMeta]:
        metas = await seg_store.stored(self.engine, *key, since, until)
        return {(m.starts_at, m.ends_at): m for m in metas}

    async def _recent(
        self, above: int, since: float, until: float
    ) -> Callable[[float, float, int], int]:
        """A counter of the observations (production, candidate, control) with id > above:
        recent(a, b, w) is how many of them belong to exchanges in [a, b) and have an id
        above w - RECHECK_IDS."""
        arms = [self.candidate] + ([self.control] if self.control else [])
        ids, times = await seg_store.observed_since(self.engine, above, arms, since, until)
        order = np.argsort(times, kind="stable")
        ids, times = ids[order], times[order]

        def recent(a: float, b: float, w: int) -> int:
            lo, hi = np.searchsorted(times, [a, b], side="left")
            return int(np.count_nonzero(ids[lo:hi] > w - seg_store.RECHECK_IDS))

        return recent

    async def _store(
        self,
        key: tuple[str, str, str],
        span: tuple[float, float],
        exchanges: int,
        watermark: int,
        recent: int,
        before: int,
    ) -> int:
        """Build one span from the rows and store it; returns its number of pairs. Its
        similarity sample is the one a window of the `before` pairs preceding it would take:
        never smaller than a window from the same start through this span takes (a window
        starting later that needs more is built from the rows, see `_assemble`)."""
        suffixes = sample_suffixes(self.similarity_max_pairs / max(1, before))
        part = await self.build(*span, suffixes, exchanges)
        data = await asyncio.to_thread(segments.encode, part)
        candidate, control, params = key
        stored = seg_store.put(
            self.engine,
            candidate=candidate,
            control=control,
            params=params,
            starts_at=span[0],
            ends_at=span[1],
            exchanges=exchanges,
            watermark=watermark,
            recent=recent,
            rows=part.n,
            sample_size=sample_size(suffixes),
            data=data,
        )
        await self._writing(stored)
        return part.n

    async def _writing(self, write: Coroutine[Any, Any, Any]) -> None:
        """Run a write of segments; a store that refuses writes (a read-only role, a full disk)
        leaves the report to build its spans from the rows, logged once per report."""
        if self.read_only:
            write.close()
            return
        try:
            await write
        except StorageError as exc:
            self.read_only = True
            log.warning("report segments not stored (%s): spans are built from the rows", exc)

    async def _assemble(
        self,
        whole: Assembly,
        spans: list[tuple[tuple[float, float], int]],
        metas: dict[tuple[float, float], seg_store.SegmentMeta],
        rows: dict[tuple[float, float], int],
        suffixes: tuple[str, ...] | None,
    ) -> None:
        """Append the spans' columns in order, reading their bytes a few spans at a time. A
        span with no stored segment, or one whose similarity sample is smaller than the
        window's (a larger `similarity_max_pairs` since), is built from the rows; so is one
        stored under another layout (or unreadable), which is then stored again."""
        need = sample_size(suffixes)
        order = [metas.get(span) for span, _ in spans]
        for lo in range(0, len(order), _READ_SPANS):
            chunk = order[lo : lo + _READ_SPANS]
            ids = [m.id for m in chunk if m is not None and m.sample_size >= need]
            data = await seg_store.blobs(self.engine, ids) if ids else {}
            for (span, _), meta in zip(spans[lo : lo + _READ_SPANS], chunk, strict=True):
                blob = data.pop(meta.id, None) if meta is not None else None
                if blob is not None and meta is not None:
                    try:
                        await asyncio.to_thread(whole.add_bytes, blob, meta.rows)
                        continue
                    except StorageError as exc:  # another layout, or not a segment at all
                        part = await self.build(*span, suffixes, rows[span])
                        await self._replace(meta, part, suffixes, exc)
                        whole.add_set(part)
                        continue
                whole.add_set(await self.build(*span, suffixes, rows[span]))

    async def _replace(
        self,
        meta: seg_store.SegmentMeta,
        part: PairSet,
        suffixes: tuple[str, ...] | None,
        exc: StorageError,
    ) -> None:
        """Store a span rebuilt from the rows over one this code cannot read (its counts were
        found current by `refresh`, so its watermark still holds). Logged once per report."""
        if not self.unreadable:
            log.warning("report segments of %r: %s; rebuilt from the rows", self.candidate, exc)
        self.unreadable += 1
        data = await asyncio.to_thread(segments.encode, part)
        candidate, control, params = self._key()
        stored = seg_store.put(
            self.engine,
            candidate=candidate,
            control=control,
            params=params,
            starts_at=meta.starts_at,
            ends_at=meta.ends_at,
            exchanges=meta.exchanges,
            watermark=meta.watermark,
            recent=meta.recent,
            rows=part.n,
            sample_size=sample_size(suffixes),
            data=data,
        )
        await self._writing(stored)


# Segments read per query while assembling: bounded memory (a few MB per span at 100 pairs/s).
_READ_SPANS = 16


async def load_capacity(engine: Engine, candidate: str) -> CapacitySummary | None:
    """The candidate's newest `canary capacity` result younger than CAPACITY_MAX_AGE_S
    (`domain.capture`)."""
    return await store.capacity(engine, candidate)
