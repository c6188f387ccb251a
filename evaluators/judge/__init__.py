"""Judging: what a metric is and how it is judged (`metric`), the verdict (`verdict`), and the
verdict settings (`settings`)."""
