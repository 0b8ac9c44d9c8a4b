"""``idemctl tasks``: the background tasks' keys counted by queue and task name, from the
keys the doors write (``task:<queue>:<task name>#<key>``), on SQLite, in-process."""

from __future__ import annotations

from pathlib import Path

from idemctl import open_store
from idemctl.tasks.guard import TaskGuard, TaskOptions
from tests.backends import expire_lease
from tests.cli.helpers import json_lines, on


def charge(order: str, amount: int) -> int:
    return amount


def decline(order: str, amount: int) -> int:
    raise ValueError("declined")


def test_tasks_counts_each_queues_tasks_and_names_their_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    store.provision()
    celery = TaskGuard("celery", "shop.charge", charge, TaskOptions(store=store, key="{order}"))
    for order in ("o-1", "o-2", "o-1"):
        celery.result(charge, (order, 5), {})
    store.claim("task:celery:shop.charge#o-3", None, 600)  # a worker's, alive
    store.claim("task:celery:shop.charge#o-4", None, 600)
    expire_lease(store, "task:celery:shop.charge#o-4")  # its worker gone
    taskiq = TaskGuard("taskiq", "shop.tasks:charge", charge, TaskOptions(store=store))
    taskiq.result(charge, ("o-1", 5), {})  # a name with a colon, the fingerprint its key
    rq = TaskGuard("rq", "shop.decline", decline, TaskOptions(store=store, permanent=(ValueError,)))
    rq.result(decline, ("o-1", 5), {})
    store.claim("charge:o-1", None, 60)  # not a task's key: not counted

    result = on(url, "tasks", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {(r["queue"], r["task"]): r for r in json_lines(result, "task.schema.json")}
    assert list(rows) == [("celery", "shop.charge"), ("rq", "shop.decline"),
                          ("taskiq", "shop.tasks:charge")]  # fmt: skip
    shop = rows["celery", "shop.charge"]
    assert (shop["completed"], shop["in_progress"], shop["stale"]) == (2, 2, 1)
    assert shop["prefix"] == "task:celery:shop.charge#"
    assert shop["oldest_in_progress_age_seconds"] is not None
    assert (
        rows["rq", "shop.decline"]["failed"],
        rows["rq", "shop.decline"]["failed_for_good"],
    ) == (1, 1)
    assert rows["taskiq", "shop.tasks:charge"]["completed"] == 1

    listed = on(url, "list", "--prefix", shop["prefix"], "--json")  # the prefix lists them
    assert len(json_lines(listed)) == 4

    only = on(url, "tasks", "--queue", "celery", "--task", "shop.charge")
    assert only.exit_code == 0, only.stderr
    assert "shop.charge" in only.stdout and "shop.decline" not in only.stdout
    assert "task:celery:shop.charge#" in only.stdout

    none = on(url, "tasks", "--queue", "arq")
    assert none.exit_code == 0 and "no task keys match" in none.stderr

    bad = on(url, "tasks", "--task", "shop.charge")
    assert bad.exit_code == 2 and "--task" in bad.stderr and "give the queue" in bad.stderr
