"""The data plane: what production needs and nothing else.

`app` (the aiohttp application), `proxy` (the hot path), `upstream` (the one HTTP client, used by
the proxy and the mirror lanes; the readiness check's session is `app`'s), `deadlines` (an
exchange's timeouts and the one timer enforcing them), `headers` (the
hop-by-hop policy), `meter` (the passive SSE/JSON response meter), `stream` (a streamed
answer past its first chunk: the meter's pre-filter for answers nobody stores, and the direct
relay from the upstream's read callback), `hooks` (the seams the other planes plug into),
`prometheus` (the Prometheus text-format exporter), `body` (bounded body reads), `connections`
(client connection limits), `limits` (descriptor budgets). The rollout's serving side (which
arm serves a session, the worker's fast guard on the candidate) is `gateway.rollout`'s route,
arms and hooks. Imports neither storage nor evaluators, nor the rollout's control side.
"""
