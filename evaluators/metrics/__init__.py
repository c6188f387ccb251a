"""Metric evaluators, one module per family (`cost`, `divergence`, `errors`, `latency`,
`preference` (a model upgrade judged by an LLM grader), `quality`, `throughput`, `toolcalls`
(tool-call validity, candidate minus production)); `tokens` says which pairs a token-derived
metric may use (both arms counted by one tokenizer) and how each arm was counted; `catalog` holds
the one EVALUATORS list."""
