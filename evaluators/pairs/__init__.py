"""Pairs: the column types (`types`, `columns`), text features (`text`), the synthetic
generator (`synthetic`) and the loader (`load`: the only module that reads storage)."""
