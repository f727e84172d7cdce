"""The periodic job's thread: rounds on schedule, failures logged without ending it, one
thread however often it is started, and a stop that waits for a round under way."""

from __future__ import annotations

import logging
import threading

import pytest

from deerflow_web.services.periodic import PeriodicJob
from tests.helpers import wait_until

pytestmark = pytest.mark.same_in_both_modes  # nothing here reads the mode

LOGGER = "tests.periodic"


class Rounds:
    """A job's work that counts its rounds; `hold` keeps a round running until released."""

    def __init__(self, *, hold: bool = False, fail_with: BaseException | None = None) -> None:
        self.count = 0
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.fail_with = fail_with
        self.threads: set[str] = set()

    def __call__(self) -> None:
        self.count += 1
        self.threads.add(threading.current_thread().name)
        self.started.set()
        self.release.wait(30)
        if self.fail_with is not None:
            raise self.fail_with


def named(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def test_rounds_run_every_interval_on_a_thread_of_the_jobs_name() -> None:
    rounds = Rounds()
    job = PeriodicJob("periodic-test", 0.01, rounds)
    job.start()
    try:
        assert job.is_running
        wait_until(lambda: rounds.count >= 3)
    finally:
        job.stop()
    assert not job.is_running
    assert rounds.threads == {"periodic-test"}
    assert named("periodic-test") == []


def test_the_first_round_waits_one_interval() -> None:
    rounds = Rounds()
    job = PeriodicJob("periodic-test", 3600, rounds)
    job.start()
    job.stop()
    assert rounds.count == 0  # stopped within the first wait: no round ever ran


def test_a_first_delay_of_zero_runs_a_round_at_once() -> None:
    rounds = Rounds()
    job = PeriodicJob("periodic-test", 3600, rounds, first_delay=0)
    job.start()
    try:
        wait_until(lambda: rounds.count == 1)
    finally:
        job.stop()
    assert rounds.count == 1  # the next one was an hour away


def test_a_round_that_raises_is_logged_and_the_schedule_goes_on(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    rounds = Rounds(fail_with=RuntimeError("the disk is gone"))
    job = PeriodicJob(
        "periodic-test", 0.01, rounds, what="test sweep", log=logging.getLogger(LOGGER)
    )
    job.start()
    try:
        wait_until(lambda: rounds.count >= 3)
        assert job.is_running
    finally:
        job.stop()
    failures = [r for r in caplog.records if r.name == LOGGER]
    assert failures and all(r.getMessage() == "test sweep failed" for r in failures)
    assert all(r.levelno == logging.ERROR and r.exc_info for r in failures)  # with traceback


def test_a_known_outage_is_one_warning_line(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    class Outage(Exception):
        pass

    rounds = Rounds(fail_with=Outage("no answer"))
    job = PeriodicJob(
        "periodic-test",
        0.01,
        rounds,
        what="test sweep",
        skips={Outage: "the server is unavailable"},
        log=logging.getLogger(LOGGER),
    )
    job.start()
    try:
        wait_until(lambda: rounds.count >= 2)
    finally:
        job.stop()
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert lines and all(r.levelno == logging.WARNING and not r.exc_info for r in lines)
    assert {r.getMessage() for r in lines} == {"test sweep skipped: the server is unavailable"}


def test_run_once_logs_as_the_schedule_does_and_does_not_raise(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    job = PeriodicJob(
        "periodic-test", 60, Rounds(fail_with=ValueError("bad")), log=logging.getLogger(LOGGER)
    )
    job.run_once()
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == ["periodic-test failed"]


def test_starting_twice_keeps_one_thread() -> None:
    rounds = Rounds()
    job = PeriodicJob("periodic-twice", 0.01, rounds)
    job.start()
    try:
        job.start()
        job.start()
        assert len(named("periodic-twice")) == 1
        wait_until(lambda: rounds.count >= 2)
        assert len(named("periodic-twice")) == 1
    finally:
        job.stop()
    assert named("periodic-twice") == []


def test_stop_waits_for_the_round_under_way_and_none_starts_after() -> None:
    rounds = Rounds(hold=True)
    job = PeriodicJob("periodic-test", 0.01, rounds)
    job.start()
    rounds.started.wait(30)
    stopping = threading.Thread(target=job.stop)
    stopping.start()
    stopping.join(0.2)
    assert stopping.is_alive()  # still waiting: the round is not interrupted
    rounds.release.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert rounds.count == 1
    assert named("periodic-test") == []


def test_a_stop_that_gives_up_waiting_still_ends_the_schedule_and_a_restart_works() -> None:
    rounds = Rounds(hold=True)
    job = PeriodicJob("periodic-test", 0.01, rounds)
    job.start()
    rounds.started.wait(30)
    job.stop(timeout=0.01)  # the round goes on; the thread ends after it
    assert not job.is_running
    job.start()  # a new thread with a signal of its own
    assert job.is_running
    rounds.release.set()
    wait_until(lambda: rounds.count >= 3)
    job.stop()
    wait_until(lambda: named("periodic-test") == [])  # the earlier thread ended too
    assert not job.is_running


def test_stop_before_start_does_nothing() -> None:
    job = PeriodicJob("periodic-test", 1, Rounds())
    job.stop()
    assert not job.is_running


@pytest.mark.parametrize("interval", [0, -1])
def test_an_interval_that_is_not_positive_is_refused_at_start(interval: float) -> None:
    job = PeriodicJob("periodic-test", interval, Rounds())
    with pytest.raises(ValueError, match="interval must be positive"):
        job.start()
    assert not job.is_running
