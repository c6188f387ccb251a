"""The mirror: sampled copies of production requests replayed against candidates, by stage.

- `channel/` — the worker side: `handoff` (the `RequestTee` a worker runs) and `frames` (the
  byte layout of the worker -> mirror process channel)
- `sampling/` — which requests become copies: `sampler` (deterministic decisions, session keys),
  `rate` and `adaptive` (sampling toward `target_rps`), `loopguard` (shedding under overload)
- `replay/` — copies to pairs: `ring` (bounded, deduplicated buffers), `order` (turn order),
  `lane` (one candidate's workers), `observe` (metered answers to records), `sinks` (an
  in-memory sink), `splits` (conversations split across replicas)
- `scoring/` — teacher-forced scoring: `forced` (the pure requests and answers), `jobs` (the
  scoring copies the mirror process runs)
- `grading/` — the LLM grader of a model upgrade: `request` (which pairs, which order, the blind
  A/B request and the parse of its answer, pure), `lane` (the bounded, capped lane toward the
  grader)
- `toolcalls/` — tool-call validity: an answer's calls against the request's declared tools
  (pure)
- `plane` — what the host's mirror process runs; `tee` — `Mirror`, owning every lane
- `counters` — the accounting counters and their Prometheus lines (pure)
- `evidence` — the ramp's evidence: RAMP frames to records with their turn, for the writer
- `capture` — the opt-in sink of captured request bodies for `canary capacity`

Importing this package imports none of its modules, so the pure ones stay free of aiohttp.
"""
