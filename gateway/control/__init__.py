"""The control plane: the registry of endpoints, the promotion use cases and the admin API.

`registry` (in-memory snapshot reloaded from storage), `promotion` (promote, rollback, gate),
`admin/` (handlers, boundary, auth, schema, openapi).
"""
