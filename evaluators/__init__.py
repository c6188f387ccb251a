"""Pure functions over pairs: `pairs` (load, columns) -> `stats` -> `metrics` -> `judge` ->
`report`; `capacity` for capacity runs; `ramp` for a traffic ramp."""
