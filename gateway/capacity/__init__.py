"""The capacity driver: replays captured conversations against an endpoint at a ramp of
offered loads (`ramp`, `replay`) and reads the engine's own metrics (`scrape`); the statistics
are evaluators.capacity's."""
