"""Metric evaluators, one module per family; `registry` holds the one EVALUATORS list."""
