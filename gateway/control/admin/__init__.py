"""The admin REST API: `handlers` (routes), `boundary` (errors -> HTTP, JSON bodies), `auth`
(bearer tokens), `schema` (wire types), `openapi` (the document)."""
