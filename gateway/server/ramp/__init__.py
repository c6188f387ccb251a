"""The ramp's serving side, in one home (as a mitmproxy addon holds its options, hooks and
metrics): `arms` (which arm serves a session: the host's shared session table, the router's
`Split` snapshot, the worker's fast guard), `route` (`RampRoute`: the worker's ramp as the proxy
uses it, the candidate's upstream with the fallback to production, the evidence record and the
`canary_rollout_*` series) and `hooks` (its seams: where the evidence goes, who makes a guard
trip durable). The statistics are evaluators.ramp's and the SQL storage's; this package imports
neither.
"""
