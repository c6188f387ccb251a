"""The wiring, on top of every plane: `runtime` (composes the planes around the proxy; ordered
shutdown), `workers` (one event loop per process, the `--workers N` supervisor), `children`
(the mirror and report child processes), `simulator` (starts the engine simulator when no live
URL is given), `demo` (`canary demo`: simulator, gateway, traffic, reports)."""
