"""Metric evaluators, one module per family (`cost`, `divergence`, `errors`, `latency`,
`preference` (a model upgrade judged by an LLM grader), `quality`, `throughput`); `catalog`
holds the one EVALUATORS list."""
