"""The gateway's planes: `server` (data plane), `mirror`, `control`, `rollout` (a promoted
candidate on live traffic: serving and control sides in one home), `sim` (the engine
simulator), `capacity` (the capacity driver), `process` (the wiring), `cli`; below them
`config`, `credentials`, `logs` and `lifecycle`."""
