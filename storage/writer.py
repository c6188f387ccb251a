"""ObservationWriter: the bounded, batched path from the mirror to the database, a
`storage.batch.BatchWriter` with two streams (exchanges, observations) under one queue bound,
and a third, the ramp's evidence (`put_rollout`: `rollout_requests`), under a bound of its own;
an LLM grader's verdicts (`put_grading`: `gradings`) share the first bound, and so do the
pairs kept for people to label (`put_label_item`: `label_items`; none with `store_text=False`).

`put_exchange` / `put_observation` are synchronous, O(1) and never wait: they append to a queue
bounded by `queue_max` records (so a database outage costs bounded memory) and, when it is
full, drop the record and count it. The batch writer drains the queue in batches — when
`batch_size` records are waiting or `flush_interval_s` has passed — with executemany-style
INSERT … ON CONFLICT DO NOTHING (duplicates are ignored, on both dialects).

While the database is unreachable the batch in hand is retried with capped exponential backoff
and jitter; it is never lost, and the queue keeps absorbing (then dropping and counting). A
batch the database rejects for its content is retried row by row, and only the offending rows
are dropped (counted as `rows_rejected`). `close()` flushes what is queued, within a deadline.

As a guard it applies again what the mirror already does (`storage.textguard`): output text
kept by `domain.observation.kept_text`, or with `store_text=False` no text at all — only its
hash, and tool-call arguments replaced by theirs. It never logs record contents.

Ramp records wait in a queue of their own bound, `evidence_queue_max` (`[rollout]`): a rollout
serves every live request, far more than the mirror samples, and must neither crowd the
mirror's records out nor be crowded out by them; beyond the bound they are `ramp_dropped`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any, Final

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.exposition import Family, Kind, Sample
from domain.records import (
    ExchangeRecord,
    GradingRecord,
    LabelItem,
    ObservationRecord,
    RolloutRecord,
)
from storage.batch import WRITER_KEYS, BatchWriter, Stream
from storage.models import Base
from storage.sql import EXCHANGES, OBSERVATIONS
from storage.textguard import exchange_row, observation_row

_STAT_KEYS: Final = (
    "queue_depth",
    "written_exchanges",
    "written_observations",
    "observations_dropped",
    "exchanges_dropped",
    "written_ramp",
    "ramp_dropped",
    "written_gradings",
    "gradings_dropped",
    "written_label_items",
    "label_items_dropped",
    *WRITER_KEYS,
)
_HELP: Final[dict[str, tuple[Kind, str]]] = {
    "queue_depth": ("gauge", "Records waiting to be written."),
    "written_exchanges": ("counter", "Exchange records written (duplicates ignored)."),
    "written_observations": ("counter", "Observation records written (duplicates ignored)."),
    "observations_dropped": ("counter", "Observations dropped: queue full or shutdown deadline."),
    "exchanges_dropped": ("counter", "Exchanges dropped: queue full or shutdown deadline."),
    "written_ramp": ("counter", "Ramp evidence records written (rollout_requests)."),
    "ramp_dropped": ("counter", "Ramp evidence dropped: its queue full or shutdown deadline."),
    "written_gradings": ("counter", "LLM grader verdicts written (gradings)."),
    "gradings_dropped": ("counter", "Gradings dropped: queue full or shutdown deadline."),
    "written_label_items": ("counter", "Graded pairs kept for people to label (label_items)."),
    "label_items_dropped": (
        "counter",
        "Pairs to label dropped: queue full, shutdown deadline, or store_text = false.",
    ),
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


def rollout_row(record: RolloutRecord) -> dict[str, Any]:
    """A ramp record as a `rollout_requests` row: its declared fields by name (None is NULL)."""
    return msgspec.structs.asdict(record)


class ObservationWriter(BatchWriter):
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
        evidence_queue_max: int = 100_000,  # [rollout] evidence_queue_max
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 5.0,
    ) -> None:
        self._exchange_stream = Stream(
            "exchange", EXCHANGES, exchange_row, "written_exchanges", "exchanges_dropped"
        )
        self._observation_stream = Stream(
            "observation",
            OBSERVATIONS,
            partial(observation_row, store_text=store_text, max_chars=store_text_max_chars),
            "written_observations",
            "observations_dropped",
        )
        # Bounds the memory ramp evidence costs during a database outage (its own bound: see
        # the module docstring); beyond it records are dropped and counted.
        self._rollout_stream = Stream(
            "ramp",
            Base.metadata.tables["rollout_requests"],
            rollout_row,
            "written_ramp",
            "ramp_dropped",
            queue_max=evidence_queue_max,
        )
        # An LLM grader's verdicts (gateway.mirror.grading), and one row for each pair it did
        # not grade (at most one per mirrored pair of a graded candidate), under the
        # observations' bound.
        self._grading_stream = Stream(
            "grading",
            Base.metadata.tables["gradings"],
            msgspec.structs.asdict,
            "written_gradings",
            "gradings_dropped",
        )
        # The text a grader was shown, of the pairs kept for labelling (bounded by the mirror's
        # grading_max_chars), under the observations' bound; never kept without store_text.
        self._store_text = store_text
        self._label_stream = Stream(
            "label_item",
            Base.metadata.tables["label_items"],
            msgspec.structs.asdict,
            "written_label_items",
            "label_items_dropped",
        )
        super().__init__(
            engine,
            (
                self._exchange_stream,
                self._observation_stream,
                self._rollout_stream,
                self._grading_stream,
                self._label_stream,
            ),
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            queue_max=queue_max,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            name="observation writer",
        )

    # ---- the sink: called on the request path, never waits
    def put_exchange(self, record: ExchangeRecord) -> None:
        self.put(self._exchange_stream, record)

    def put_observation(self, record: ObservationRecord) -> None:
        self.put(self._observation_stream, record)

    def put_rollout(self, record: RolloutRecord) -> None:
        """One request of an open rollout (from the mirror process's RAMP frames)."""
        self.put(self._rollout_stream, record)

    def put_grading(self, record: GradingRecord) -> None:
        """One grading by a candidate's LLM grader (from the mirror process)."""
        self.put(self._grading_stream, record)

    def put_label_item(self, item: LabelItem) -> None:
        """A graded pair kept for people (from the mirror process); dropped and counted with
        store_text = false, whose promise is that no answer text is kept."""
        if not self._store_text:
            self.counts["label_items_dropped"] += 1
            return
        self.put(self._label_stream, item)

    # ---- numbers
    def stats(self) -> dict[str, int]:
        out = dict(self.counts)
        out["queue_depth"] = self.depth + self.in_flight
        return out

    def prometheus_lines(self) -> Iterable[Sample]:
        stats = self.stats()
        for key in _STAT_KEYS:
            yield FAMILIES[key].sample(stats[key])
