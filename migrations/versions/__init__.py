"""Alembic revisions, one file each, applied in order by `canary db upgrade`."""
