"""The control plane: the registry of endpoints, the promotion use cases, reports and the
admin API.

`registry` (in-memory snapshot reloaded from storage), `promotion` (promote, rollback, gate),
`reports` (the host's report process and its client), `admin/` (handlers, boundary, auth,
guard, schema, openapi, ui). The rollout's use cases and controller are `gateway.rollout`'s.
"""
