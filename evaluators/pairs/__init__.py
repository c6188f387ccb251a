"""Pairs: the column types (`types`, `columns`), text features (`text`), the synthetic
generator (`synthetic`), the loader (`load`), stored report segments (`segments`), columns
spilled to a file (`spill`) and an LLM grader's verdicts as columns (`gradings`)."""
