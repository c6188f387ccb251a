"""The report path's SQL: everything `evaluators.pairs.load` reads or stores, as functions that
return numpy arrays, row tuples, msgspec records or domain types (never a SQLAlchemy object
the evaluators would have to understand).

- `pairs`     the pairs of a window (counts, the streaming rows), the copy accounting, the
              candidate's endpoints and capacity result
- `segments`  stored report segments: stored spans and the counts that say whether they hold
- `rollout`   a rollout's live requests, as the per-request arrays of the rollout's step judge
- `gradings`  a candidate's LLM grader verdicts with their exchange's arrival and session
- `labels`    the pairs of a candidate kept for people and their labels (people's check)
"""
