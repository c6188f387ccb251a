"""The capacity driver: replays captured conversations against an endpoint at a sweep of
offered loads (`sweep`, `replay`) and reads the engine's own metrics (`scrape`); the statistics
are evaluators.capacity's."""
