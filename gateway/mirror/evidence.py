"""`RolloutEvidence`: the mirror process's side of the rollout's evidence path (RAMP frames ->
records).

Each RAMP frame a worker sends (a `domain.records.RolloutRequest`, `frames.rollout_frame`) becomes
one `domain.records.RolloutRecord`: the mirror process numbers the session's requests within the
rollout in arrival order (every worker of the host writes to this one process, so a host's
turns are in order) and stamps its replica, then hands the record to the writer's sink.

The turn counters are a bounded LRU keyed by (generation, session): a session evicted and seen
again restarts at turn 1 (counted `ramp_turns_evicted`), so memory stays bounded however many
sessions a rollout meets. It never does IO itself and never blocks: the sink drops and counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from domain.records import RolloutRecord
from gateway.mirror.channel import frames

__all__ = ["TURNS_MAX", "RolloutEvidence"]

# Sessions whose turn count is remembered: about 250 bytes each in an OrderedDict, so at most
# ~64 MiB of the mirror process; only sessions unseen the longest restart their count.
TURNS_MAX: Final = 1 << 18


class RolloutEvidence:
    """Decodes RAMP metas, assigns turns per (generation, session), passes records on."""

    __slots__ = ("_put", "_replica", "_turns", "_turns_max", "counts")

    def __init__(
        self, put: Callable[[RolloutRecord], None], replica: str, turns_max: int = TURNS_MAX
    ) -> None:
        self._put = put
        self._replica = replica
        self._turns_max = max(1, turns_max)
        self._turns: OrderedDict[tuple[object, object], int] = OrderedDict()
        # Exported with the plane's frame events (canary_mirror_plane_total).
        self.counts = {"ramp_records": 0, "ramp_turns_evicted": 0}

    def on_frame(self, meta: bytes) -> None:
        """One RAMP frame's meta (raises struct.error when it is not one)."""
        fields = frames.ROLLOUT_LAYOUT.fields(meta)
        key = (fields["generation"], fields["session"])
        turns = self._turns
        turn = turns.pop(key, 0) + 1
        turns[key] = turn
        if len(turns) > self._turns_max:
            turns.popitem(last=False)
            self.counts["ramp_turns_evicted"] += 1
        self.counts["ramp_records"] += 1
        self._put(RolloutRecord(**fields, turn=turn, replica=self._replica))  # type: ignore[arg-type]
