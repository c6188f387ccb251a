"""The rollout: a promoted candidate served to a growing share of new sessions, in one home (as
a mitmproxy addon holds its options, hooks and metrics). To ramp is to move that share, step by
step, from production to the candidate.

Serving side, on a worker's request path (imports neither storage nor the evaluators):
`arms` (which arm serves a session: the host's shared session table, the router's `Split`
snapshot, the worker's fast guard), `route` (`RolloutRoute`: the worker's rollout as the proxy
uses it, bound once to its options, the `[rollout]` table's `RolloutConfig`; the candidate's
upstream with the fallback to production, the evidence record and the `canary_rollout_*`
series) and `hooks` (its seams: where the evidence goes, who makes a guard trip durable).

Control side: `state` (the use cases: start from a `promote` verdict, the operators' pause,
resume, advance and abort, the arms snapshot a worker routes by, a guard trip made durable) and
`controller` (`RolloutController`: judges each step from live evidence, in the host's report
process). The statistics are `evaluators.rollout`'s and the SQL `storage.rollouts` and
`storage.reports.rollout`.
"""
