"""Storage of `canary capacity`: `captures` (captured conversations, bounded and redacted) and
`runs` (capacity runs and their steps)."""
