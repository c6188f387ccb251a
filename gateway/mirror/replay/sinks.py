"""An in-memory `ObservationSink` for tests and the demo; storage provides the real writer.

Bounded like every sink must be: past `max_records` new records are dropped and counted.
"""

from __future__ import annotations

from domain.records import ExchangeRecord, GradingRecord, ObservationRecord

__all__ = ["InMemorySink"]


class InMemorySink:
    """Keeps exchanges, observations and gradings in lists, joined on demand by exchange id."""

    __slots__ = ("dropped", "exchanges", "gradings", "max_records", "observations")

    def __init__(self, max_records: int = 1_000_000) -> None:
        self.max_records = max_records  # bounded: a test that forgets to read cannot eat the host
        self.exchanges: list[ExchangeRecord] = []
        self.observations: list[ObservationRecord] = []
        self.gradings: list[GradingRecord] = []
        self.dropped = 0

    def put_exchange(self, record: ExchangeRecord) -> None:
        if len(self.exchanges) >= self.max_records:
            self.dropped += 1
            return
        self.exchanges.append(record)

    def put_observation(self, record: ObservationRecord) -> None:
        if len(self.observations) >= self.max_records:
            self.dropped += 1
            return
        self.observations.append(record)

    def put_grading(self, record: GradingRecord) -> None:
        if len(self.gradings) >= self.max_records:
            self.dropped += 1
            return
        self.gradings.append(record)

    def pairs(self) -> dict[str, dict[str, ObservationRecord]]:
        """exchange id -> {endpoint name -> observation} (production and candidates)."""
        out: dict[str, dict[str, ObservationRecord]] = {}
        for obs in self.observations:
            out.setdefault(obs.exchange_id, {})[obs.endpoint] = obs
        return out

    def candidate(self, name: str) -> list[ObservationRecord]:
        """The observations of one candidate, in the order they completed."""
        return [o for o in self.observations if o.arm == "candidate" and o.endpoint == name]
