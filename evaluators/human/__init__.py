"""People check the grader: people's labels of a random subset of graded units turn the grader's
net preference into an interval on what people prefer (prediction-powered inference,
docs/reports-and-statistics.md "People check the grader").

- `data`       labels and kept pairs as columns keyed by the gradings' pair codes
- `estimate`   the prediction-powered sequence, people's labels alone, PPI++ at a fixed n
- `agreement`  the confusion matrix with ties and Cohen's κ
- `metric`     the report's `human_preference` (gating with `preference_source = "human"`)
- `render`     its report tables
"""
