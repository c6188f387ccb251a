"""Pure statistics of a capacity run: SLOs, goodput per step, capacity at the SLO with bootstrap
intervals, cost at capacity, and the renderings. No IO, no asyncio, no storage."""
