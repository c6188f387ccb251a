"""Pure statistics of a capacity run: `slo` (the SLOs), `goodput` (goodput per step),
`estimate` (capacity at the SLO with bootstrap intervals, cost at capacity) and `render` (the
renderings). No IO, no asyncio, no storage."""
