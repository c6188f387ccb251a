"""Which production requests become copies: `sampler` (deterministic hash decisions and
session keys, pure), `rate` (the target-rate controller's math, pure), `adaptive` (the mirror
process's side of it), `capacity` (the capacity shares an overloaded mirror grants, pure),
`loopguard` (sheds new copies while the mirror process is overloaded), `tick` (the mirror
process's once-a-second tick of the capacity and `target_rps` controllers, part of its `Mirror`)."""
