"""idemctl.tasks.rq's own rules, in one process: rq's synchronous queue runs each job as a
worker would (its Job, its failure handling), on fakeredis, with the memory store. The
real worker, SIGKILLed, is test_queues.py's."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("rq")

from rq import Queue
from rq.job import JobStatus
from rq.timeouts import JobTimeoutException

from idemctl import (
    FingerprintMismatch,
    HandlerTimeout,
    KeyBusy,
    Status,
    current_context,
    open_store,
)
from idemctl.tasks.rq import idempotent

STORE = open_store("memory://")
RUNS: list[tuple[str, int]] = []


@idempotent(store=STORE, key="{order}")
def charge(order: str, amount: int) -> dict[str, Any]:
    RUNS.append((order, amount))
    return {"charged": amount, "token": current_context().fencing_token}


@idempotent(store=STORE)
def add(a: int, b: int = 0) -> int:
    RUNS.append(("add", a))
    return a + b


@idempotent(store=STORE, key="{n}")
def slow(n: int) -> int:
    raise JobTimeoutException("Task exceeded maximum timeout value (1 seconds)")


@idempotent(store=STORE, key="{n}", busy="requeue")
def held(n: int) -> int:
    raise AssertionError("ran beside the holder")


@pytest.fixture
def queue() -> Queue:
    fakeredis = pytest.importorskip("fakeredis")
    RUNS.clear()
    return Queue("default", connection=fakeredis.FakeRedis(), is_async=False)


def test_a_repeat_returns_the_stored_result_and_another_amount_fails_the_job(queue: Queue) -> None:
    first = queue.enqueue(charge, "o-1", 100)
    again = queue.enqueue(charge, "o-1", 100)
    assert first.get_status() == again.get_status() == JobStatus.FINISHED
    assert first.return_value() == again.return_value()
    assert first.return_value()["charged"] == 100 and RUNS == [("o-1", 100)]
    other = queue.enqueue(charge, "o-1", 200)
    assert other.get_status() == JobStatus.FAILED
    assert FingerprintMismatch.__name__ in (other.latest_result().exc_string or "")
    assert RUNS == [("o-1", 100)]
    assert charge("o-1", 100) == first.return_value()  # called in this process: guarded too


def test_the_default_key_is_the_functions_dotted_name_and_its_arguments(queue: Queue) -> None:
    assert queue.enqueue(add, 1, 2).return_value() == 3
    assert queue.enqueue(add, 1, b=2).return_value() == 3  # the same call, by keyword
    assert RUNS == [("add", 1)]
    keys = [r.key for r in STORE.scan().records if ".add#" in r.key]
    assert len(keys) == 1 and keys[0].startswith("task:rq:tests.tasks.test_rq.add#")


def test_rqs_job_timeout_is_a_retriable_handler_timeout(queue: Queue) -> None:
    job = queue.enqueue(slow, 1)
    assert job.get_status() == JobStatus.FAILED
    assert HandlerTimeout.__name__ in (job.latest_result().exc_string or "")
    record = STORE.get("task:rq:tests.tasks.test_rq.slow#1")
    assert record is not None and record.status is Status.FAILED and record.retriable


def test_a_held_key_fails_the_job_with_key_busy_for_rqs_retry(queue: Queue) -> None:
    STORE.claim("task:rq:tests.tasks.test_rq.held#1", None, 60)  # another worker's attempt, alive
    job = queue.enqueue(held, 1)
    assert job.get_status() == JobStatus.FAILED
    assert KeyBusy.__name__ in (job.latest_result().exc_string or "")
