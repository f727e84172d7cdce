"""Leases for periodic jobs (`job_leases`): one instance at a time runs a job.

Taking a lease is one conditional UPDATE after an insert that does nothing when the row
exists, so of two instances trying at once exactly one gets it; a holder that stops
renewing (its instance died) loses it once `lease_until` has passed. A job that runs once
per interval between all instances keeps the time of its last run in its row too.
"""

from __future__ import annotations

import json

from sqlalchemy import Engine
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from deerflow_web.storage.database import job_leases
from deerflow_web.storage.database import write_transaction


class JobLeases:
    """Who runs each periodic job."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def take(self, name: str, owner: str, now: float, until: float) -> bool:
        """Hold `name` until `until` if it is free, lapsed or ours already."""
        with write_transaction(self.engine) as db:
            dialect_insert = pg_insert if db.dialect.name == "postgresql" else sqlite_insert
            db.execute(
                dialect_insert(job_leases)
                .values(name=name, owner=owner, lease_until=0.0)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            result = db.execute(
                update(job_leases)
                .where(
                    job_leases.c.name == name,
                    or_(job_leases.c.owner == owner, job_leases.c.lease_until < now),
                )
                .values(owner=owner, lease_until=until)
            )
            return result.rowcount > 0

    def release(self, name: str, owner: str) -> None:
        """Give the lease up (the job finished, the process stops)."""
        with write_transaction(self.engine) as db:
            db.execute(
                update(job_leases)
                .where(job_leases.c.name == name, job_leases.c.owner == owner)
                .values(lease_until=0.0)
            )

    def last_run(self, name: str) -> float:
        """When `name` last ran to its end (`remember_run`), on any instance; 0.0 if never
        (or if the row's state is not one this code wrote)."""
        with self.engine.connect() as db:
            state = db.execute(
                select(job_leases.c.state).where(job_leases.c.name == name)
            ).scalar_one_or_none()
        try:
            return float(json.loads(state or "{}").get("last_sweep", 0.0))
        except (ValueError, AttributeError, TypeError):
            return 0.0

    def remember_run(self, name: str, when: float) -> None:
        """Keep `when` as the time `name` last ran, for every instance's `last_run`.

        Kept in the lease's row (taken before the job ran, so it exists), under the key
        the first releases wrote, so a row written by an older release still counts.
        """
        with write_transaction(self.engine) as db:
            db.execute(
                update(job_leases)
                .where(job_leases.c.name == name)
                .values(state=json.dumps({"last_sweep": when}))
            )
