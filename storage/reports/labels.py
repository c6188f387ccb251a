"""The SQL a report's people's check reads: the pairs of a candidate kept for labelling and its
labels (`storage.labels` holds the labelling store; these are its two reads the report path
makes, here so the evaluators reach storage only through `storage.reports`)."""

from __future__ import annotations

from storage.labels import kept_ids, labels_of

__all__ = ["kept_ids", "labels_of"]
