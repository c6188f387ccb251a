"""The project's nouns, one home each: imported by every plane, importing nothing of ours.

- `endpoint` — `Endpoint`, `CandidateSpec`, `CandidatePatch` and their bounded field types
- `observation` — the measured per-pair quantities, declared once (storage and evaluators derive
  their columns from it)
- `records` — exchange, observation, promotion and rollout records that cross package
  boundaries
- `accounting` — the copy-accounting keys and their identities
- `outcomes` — error kinds and finish reasons
- `kinds` — candidate kind -> goal metrics (one table)
- `capture` — the captured-conversation record of `canary capacity`
- `exposition` — Prometheus metric names and help texts shared by the processes
- `timing` — clocks and durations shared by the planes
- `errors` — the one exception tree
- `ids` — UUIDv7
"""
