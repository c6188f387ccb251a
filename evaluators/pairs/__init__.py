"""Pairs: the column types (`types`, `columns`), text features (`text`), the synthetic
generator (`synthetic`), the loader (`load`), stored report segments (`segments`) and columns
spilled to a file (`spill`)."""
