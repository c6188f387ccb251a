"""Copy accounting: the names of the counters every copy is counted in, and their identities.

For each candidate, between any two callbacks of the event loop:
    sampled = deduplicated + dropped_overflow + dropped_oversize + shed_overload
              + shed_capacity + shed_session_broken + sent + pending
    sent    = observed_ok + observed_error + timed_out
`shed_capacity` (shed by the sampler's hash under the mirror's capacity share, sessions whole)
is a sampling decision, not a lost copy: coverage leaves it out of the copies due.
`shed_session_broken` is a later turn of a session one of whose earlier turns never reached the
candidate (dropped, shed, or unanswered): shed so that a candidate receives a session's turns as
a prefix or not at all, never headless; it follows a lost copy, and is counted missing with it.
Every other way out of `sampled` short of `sent` is a copy lost.
and for the scoring copies it was asked to answer (scoring.py in the mirror):
    score_sampled = score_dropped + score_sent + score_pending
    score_sent    = score_ok + score_unsupported + score_failed
The mirror counts under these names, storage keeps them per replica, the report shows them.
Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Scoring copies (gateway/mirror/scoring/forced.py), counted on the endpoint that was asked to
# score:
#   score_sampled = score_dropped + score_sent + score_pending
#   score_sent    = score_ok + score_unsupported + score_failed
SCORE_IDENTITY_FIELDS: Final = (
    "score_sampled",
    "score_dropped",
    "score_sent",
    "score_ok",
    "score_unsupported",
    "score_failed",
)
# Later turns of a broken session, shed so that none reaches the candidate headless.
SHED_SESSION_BROKEN: Final = "shed_session_broken"
# Monotonic per-candidate counters, in the order they are exported.
IDENTITY_FIELDS: Final = (
    "sampled",
    "deduplicated",
    "dropped_overflow",
    "dropped_oversize",
    "shed_overload",
    "shed_capacity",
    SHED_SESSION_BROKEN,
    "sent",
    "observed_ok",
    "observed_error",
    "timed_out",
    *SCORE_IDENTITY_FIELDS,
)
# When copies were shed by hash: the mirror process's first and last second (epoch seconds)
# with a capacity share in force for the candidate, and how many seconds had one. Not copies,
# not in the identity: storage merges them over replicas by min, max and sum.
SHED_FIRST_AT: Final = "shed_capacity_first_at"
SHED_LAST_AT: Final = "shed_capacity_last_at"
SHED_SECONDS: Final = "shed_capacity_seconds"
SHED_WHEN_FIELDS: Final = (SHED_FIRST_AT, SHED_LAST_AT, SHED_SECONDS)
# The `/tokenize` requests a candidate answered for the token counter (when its engine counts
# every arm's tokens): load beside its copies, not copies; not in the identity, summed.
TOKENIZE_REQUESTS_KEY: Final = "tokenize_requests"
# The same, answered by the candidate's control: a candidate's report carries it beside its own.
CONTROL_TOKENIZE_REQUESTS_KEY: Final = "control_tokenize_requests"
# Point-in-time values (not sums over time): only replicas still reporting count.
GAUGE_FIELDS: Final = ("pending", "inflight", "buffer_items", "buffer_bytes", "score_pending")
# The keys a report's accounting carries, in display order.
ACCOUNTING_KEYS: Final = (
    "sampled",
    "deduplicated",
    "dropped_overflow",
    "dropped_oversize",
    "shed_overload",
    "shed_capacity",
    SHED_SESSION_BROKEN,
    "sent",
    "pending",
    "observed_ok",
    "observed_error",
    "timed_out",
    *SCORE_IDENTITY_FIELDS,
    "score_pending",
)
# Copies that reached the candidate and came to an end.
OBSERVED_FIELDS: Final = ("observed_ok", "observed_error", "timed_out")
# A replica's snapshot older than this no longer counts its gauges (a replica that died without
# its final flush would report its last "pending" for ever), and a replica whose snapshot is
# older while its exchanges kept arriving is stale: a dozen flush intervals at the default.
# Storage sums the counters by it; the report's loader counts stale replicas by it.
GAUGE_MAX_AGE_S: Final = 60.0
# The report's accounting key: replicas whose counters lag the exchanges they stored (then the
# counters under-count and the report must not trust them for coverage).
STALE_REPLICAS: Final = "stale_replicas"


def identity_holds(c: Mapping[str, int]) -> bool:
    """Both accounting identities, on one candidate's counters (with `pending`)."""
    dropped = c["dropped_overflow"] + c["dropped_oversize"] + c["shed_overload"]
    dropped += c.get("shed_capacity", 0) + c.get(SHED_SESSION_BROKEN, 0)  # absent: older rows
    left = c["deduplicated"] + dropped + c["sent"] + c["pending"]
    copies = c["sampled"] == left and c["sent"] == sum(c[k] for k in OBSERVED_FIELDS)
    return copies and score_identity_holds(c)


def score_identity_holds(c: Mapping[str, int]) -> bool:
    """The scoring copies' identities (counters absent count 0: rows from older replicas)."""
    g = c.get
    sampled = g("score_sampled", 0)
    left = g("score_dropped", 0) + g("score_sent", 0) + g("score_pending", 0)
    ended = g("score_ok", 0) + g("score_unsupported", 0) + g("score_failed", 0)
    return sampled == left and g("score_sent", 0) == ended
