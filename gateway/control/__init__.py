"""The control plane: the registry of endpoints, the promotion use cases, reports and the
admin API.

`registry` (in-memory snapshot reloaded from storage), `promotion` (promote, rollback, gate),
`reports` (the host's report process and its client), `rollout` (the ramp's use cases, the
arms snapshot and the guard's rollback), `controller` (judges each ramp step, in the report
process), `admin/` (handlers, boundary, auth,
guard, schema, openapi, ui).
"""
