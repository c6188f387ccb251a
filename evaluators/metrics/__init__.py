"""Metric evaluators, one module per family (`cost`, `divergence`, `errors`, `latency`,
`quality`, `throughput`); `catalog` holds the one EVALUATORS list."""
