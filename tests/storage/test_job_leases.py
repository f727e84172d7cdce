"""Job leases: one holder at a time, a lapsed lease free again, and the time of a job's
last run kept in its row for every instance. SQLite and PostgreSQL each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from deerflow_web.storage.database import job_leases
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.migrate import open_database

pytestmark = pytest.mark.same_in_both_modes  # nothing here reads the mode


@pytest.fixture
def leases(base_dir: Path, database_url: str) -> Iterator[JobLeases]:
    engine = open_database(base_dir, database_url)
    yield JobLeases(engine)
    engine.dispose()


def test_one_holder_at_a_time_until_it_lapses_or_is_released(leases: JobLeases) -> None:
    assert leases.take("job", "a", 100.0, 200.0)
    assert leases.take("job", "a", 150.0, 250.0)  # the holder renews
    assert not leases.take("job", "b", 200.0, 300.0)  # held until 250
    assert leases.take("job", "b", 251.0, 350.0)  # lapsed
    leases.release("job", "b")
    assert leases.take("job", "a", 260.0, 360.0)
    assert leases.take("other", "b", 260.0, 360.0)  # another job's lease is its own


def test_a_job_that_never_ran_last_ran_at_zero(leases: JobLeases) -> None:
    assert leases.last_run("job") == 0.0  # no row at all
    assert leases.take("job", "a", 100.0, 200.0)
    assert leases.last_run("job") == 0.0  # a row, no run remembered


def test_the_last_run_is_kept_across_holders_and_releases(leases: JobLeases) -> None:
    assert leases.take("job", "a", 100.0, 200.0)
    leases.remember_run("job", 123.5)
    leases.release("job", "a")
    assert leases.last_run("job") == 123.5
    assert leases.take("job", "b", 300.0, 400.0)  # taking it keeps the time
    assert leases.last_run("job") == 123.5
    leases.remember_run("job", 350.0)
    assert leases.last_run("job") == 350.0
    assert leases.last_run("other") == 0.0


@pytest.mark.parametrize("state", ["not json", "[1, 2]", '{"last_sweep": "soon"}', "{}"])
def test_a_state_this_code_did_not_write_counts_as_never(leases: JobLeases, state: str) -> None:
    assert leases.take("job", "a", 100.0, 200.0)
    with write_transaction(leases.engine) as db:
        db.execute(update(job_leases).where(job_leases.c.name == "job").values(state=state))
    assert leases.last_run("job") == 0.0


def test_a_row_written_by_an_earlier_release_still_counts(leases: JobLeases) -> None:
    assert leases.take("job", "a", 100.0, 200.0)
    with write_transaction(leases.engine) as db:
        db.execute(
            update(job_leases)
            .where(job_leases.c.name == "job")
            .values(state='{"last_sweep": 42.0}')
        )
    assert leases.last_run("job") == 42.0
