"""The project's nouns, one home each: imported by every plane, importing nothing of ours.

- `endpoint` — `Endpoint`, `CandidateSpec`, `CandidatePatch` and their bounded field types
- `records` — exchange, observation and promotion records that cross package boundaries
- `accounting` — the copy-accounting keys and their identities
- `outcomes` — error kinds and finish reasons
- `kinds` — candidate kind -> goal metrics (one table)
- `errors` — the one exception tree
- `ids` — UUIDv7
"""
