"""The channel between a worker and the host's mirror process: `handoff` (the worker's
non-blocking side) and `frames` (the frame layout and message types, pure)."""
