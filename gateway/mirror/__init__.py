"""The mirror: sampled copies of production requests replayed against candidates.

- `sampler` — deterministic sampling decisions and session keys (pure)
- `ring` — per-candidate bounded, deduplicated, session-ordered buffers and the global budget (pure)
- `counters` — the accounting counters and their Prometheus lines (pure)
- `observe` — metered responses to storage records (pure)
- `dispatcher` — one candidate's lane: ring, workers, own HTTP session
- `loopguard` — sheds new copies while the event loop lags or saturates its core
- `tee` — `Mirror`, the `RequestTee` the proxy calls; `sinks` — an in-memory `ObservationSink`

Importing this package imports none of its modules, so the pure ones stay free of aiohttp.
"""
