"""Alembic environment and revisions: the only way canary-gateway's schema changes.

Shipped inside the installed package (alembic.ini, env.py, script.py.mako, versions/), so
`canary db upgrade` works from any directory; `storage.migrate` builds the Alembic config.
"""
