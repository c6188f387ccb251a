"""The process: `config` (the only reader of files and environment variables), `runtime`
(composes the planes around the proxy; ordered shutdown), `workers` (one event loop per
process, the `--workers N` supervisor), `logs` (structured logging)."""
