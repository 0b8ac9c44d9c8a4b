"""The operator's actions as library calls returning data: what ``idemctl init``,
``inspect``, ``list``, ``stats``, ``tasks``, ``doctor``, ``unlock``, ``forget``, ``purge``,
``audit`` and ``outbox status``, ``replay`` and ``purge`` do, for every front end (the CLI renders
these results; the console and a user's own tooling call the same functions)::

    from idemctl import operate

    with operate.open_target("redis://localhost:6379/0") as target:
        for page in operate.records(target, operate.Query(stale=True), limit=100):
            for record in page.items:
                print(record.key)
        done = operate.unlock_stale(target, dry_run=True)

A store of another layout (``layout=powertools``) is a target of its own kind: the same
calls work on it, with its states, and options that mean nothing there raise
``OptionError``. Nothing here prints. ``idemctl.operate.documents`` turns the results into the
``--json`` documents."""

from idemctl.operate.doctor import DoctorReport, diagnose
from idemctl.operate.init import init
from idemctl.operate.kafka import audit
from idemctl.operate.look import entities, inspect, inspect_entity, records, stats
from idemctl.operate.outbox import outbox_purge, outbox_replay, outbox_status
from idemctl.operate.repair import forget, forget_entity, purge, unlock, unlock_stale
from idemctl.operate.results import Action, Counts, Page, Words
from idemctl.operate.targets import PowertoolsTarget, Query, StoreTarget, Target, open_target
from idemctl.operate.tasks import TaskCounts, tasks

__all__ = [
    "Action",
    "Counts",
    "DoctorReport",
    "Page",
    "PowertoolsTarget",
    "Query",
    "StoreTarget",
    "Target",
    "TaskCounts",
    "Words",
    "audit",
    "diagnose",
    "entities",
    "forget",
    "forget_entity",
    "init",
    "inspect",
    "inspect_entity",
    "open_target",
    "outbox_purge",
    "outbox_replay",
    "outbox_status",
    "purge",
    "records",
    "stats",
    "tasks",
    "unlock",
    "unlock_stale",
]
