"""Pure functions over pairs: `pairs` (load, columns) -> `stats` -> `metrics` -> `judge` ->
`report`; `human` for people's labels checking an LLM grader; `capacity` for capacity runs;
`rollout` for a rollout's live evidence."""
