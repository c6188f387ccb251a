"""Judging: what a metric is and how it is judged (`metric`), the verdict (`verdict`), the
verdict settings (`settings`) and the time to a decision (`plan`)."""
