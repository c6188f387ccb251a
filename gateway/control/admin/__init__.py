"""The admin REST API: `handlers` (routes), `boundary` (errors -> HTTP, JSON bodies), `auth`
(bearer tokens), `guard` (failed-authentication back-off), `schema` (wire types), `openapi` (the
document), `ui` (the live page), `labels` (people labelling graded pairs)."""
