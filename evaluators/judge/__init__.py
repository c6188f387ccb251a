"""Judging: what a metric is and how it is judged (`metric`), the verdict (`verdict`), the
verdict settings (`settings`), the time to a decision (`plan`) and a model upgrade's graded
sessions and their cost (`preference_plan`) and the labels people's check needs
(`label_plan`)."""
