"""The gateway's planes: `server` (data plane), `mirror`, `control`, `sim` (the engine
simulator), `capacity` (the capacity driver), `process` (the wiring), `cli`; below them
`config`, `credentials`, `logs` and `lifecycle`."""
