"""Storage: SQLAlchemy 2.0 async models, the engine factory, typed queries, the observation
writer (docs/design.md, "Storage and data model"). Imports neither `gateway` nor `evaluators`;
raises only domain.errors.

- `engine`      make_engine, schema_state, upgrade/downgrade, ensure_schema
- `migrate`     Alembic driven from code
- `models`      the tables; migrations/ holds the Alembic revisions that create them
- `sql`         dialect helpers shared by the queries
- `queries`     control-plane queries (endpoints, seed, counters)
- `promotions`  promote / rollback and their audit rows
- `rollouts`    a candidate's ramp on live traffic: start, transitions, the push (LISTEN)
- `batch`       batched inserts of exchanges and observations
- `writer`      ObservationWriter (bounded, batched, retrying; the mirror's sink)
- `textguard`   output text bounded before it is stored
- `labels`      graded pairs kept for people, and their labels
- `reports/`    the report path's SQL: pairs of a window, stored report segments
- `capacity/`   captured conversations and capacity runs of `canary capacity`
"""
