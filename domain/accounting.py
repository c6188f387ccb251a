"""Copy accounting: the names of the counters every copy is counted in, and their identities.

For each candidate, between any two callbacks of the event loop:
    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload + sent + pending
    sent    = observed_ok + observed_error + timed_out
The mirror counts under these names, storage keeps them per replica, the report shows them.
Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Monotonic per-candidate counters, in the order they are exported.
IDENTITY_FIELDS: Final = (
    "sampled",
    "deduplicated",
    "dropped_overflow",
    "dropped_oversize",
    "shed_overload",
    "sent",
    "observed_ok",
    "observed_error",
    "timed_out",
)
# Point-in-time values (not sums over time): only replicas still reporting count.
GAUGE_FIELDS: Final = ("pending", "inflight", "buffer_items", "buffer_bytes")
# The keys a report's accounting carries, in display order.
ACCOUNTING_KEYS: Final = (
    "sampled",
    "deduplicated",
    "dropped_overflow",
    "dropped_oversize",
    "shed_overload",
    "sent",
    "pending",
    "observed_ok",
    "observed_error",
    "timed_out",
)
# Copies that reached the candidate and came to an end.
OBSERVED_FIELDS: Final = ("observed_ok", "observed_error", "timed_out")


def identity_holds(c: Mapping[str, int]) -> bool:
    """Both accounting identities, on one candidate's counters (with `pending`)."""
    dropped = c["dropped_overflow"] + c["dropped_oversize"] + c["shed_overload"]
    left = c["deduplicated"] + dropped + c["sent"] + c["pending"]
    return c["sampled"] == left and c["sent"] == sum(c[k] for k in OBSERVED_FIELDS)
