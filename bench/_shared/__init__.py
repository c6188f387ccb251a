"""What bench/ scripts and tests/ both use. The scripts import it as `bench._shared` (the
repository root on `sys.path`), and so may the tests; it must never import `tests`
(tests/test_bench_imports.py), so that a script needs none of the suite's fixtures.

- `world`: the independent world of agent sessions the verdict validations draw from
- `rollout_traffic`, `rollout_sim`: a ramp step's live traffic, and a whole ramp in simulated time
- `vllm_metrics`: an engine's `/metrics` read as numbers (`scrape`, `delta`)
- `ports`: a free port on 127.0.0.1
- `waiting`: waits for the product's own signal (a URL answering), bounded by its settings
- `nginx`, `fleet`: the shipped nginx config in front of `canary serve` replicas run as child
  processes on one database (the fleet tests, the rollout fleet)
- `rollout_fleet`: that fleet with arms naming themselves, and the rollback-reach trial
- `browser_stack`: a `canary serve` over simulated engines and Playwright's chromium (the browser
  tests, `ui_overhead.py`)
"""
