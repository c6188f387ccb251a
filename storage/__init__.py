"""Storage: SQLAlchemy 2.0 async models, the engine factory, typed queries, the observation
writer (DESIGN.md §5). Imports neither `gateway` nor `evaluators`; raises only domain.errors.

- engine.py      make_engine, schema_state, upgrade/downgrade, ensure_schema
- queries.py     control-plane queries (endpoints, seed, promote/rollback, counters)
- writer.py      ObservationWriter (bounded, batched, retrying; the mirror's sink)
- models.py      the tables; migrations/ holds the Alembic revisions that create them
- records.py     the msgspec records other packages exchange with storage
"""
