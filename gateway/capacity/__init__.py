"""The capacity driver: replays captured conversations against an endpoint at a ramp of
offered loads and measures each request (the statistics are evaluators.capacity's)."""
