"""The console's repairs: unlock a key, unlock every stale key, forget a key or an entity,
purge what is past retention, replay an outbox row. Each is the operate layer's action:
asked for (GET) it runs as a dry run and shows what it would do; confirmed (POST, the
confirmation typed) it runs, and the operator log says who did it and what came of it.

A confirmation names what it acts on: the key, the entity or the row's id; for a sweep
its verb and the count the dry run found (``purge 1200``), so that a sweep that grew
since its preview asks again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idemctl import operate
from idemctl.console.views import Where, masked, seconds, store_of
from idemctl.errors import ConfigError
from idemctl.operate.documents import action as action_document


@dataclass(frozen=True)
class Act:
    """One repair: what it reads from the form, its dry run and its run as documents."""

    name: str
    title: str
    needs: str
    """The parameter naming what it acts on: key, entity, id, or older_than (a sweep)."""
    run: Callable[[Where, Mapping[str, str], bool], dict[str, Any]]
    """(where, params, dry_run) -> the action's document."""

    @property
    def sweep(self) -> bool:
        return self.needs == "older_than"

    def subject(self, params: Mapping[str, str]) -> str:
        """What it acts on, as the operator log names it: the key, ``entity E``, the row's
        id, or ``older than D`` for a sweep."""
        if self.sweep:
            return f"older than {params.get('older_than') or '0s'}"
        if self.name == "forget" and params.get("entity"):
            return f"entity {params['entity']}"
        return params.get(self.needs, "")

    def confirmation(self, preview: Mapping[str, Any], params: Mapping[str, str]) -> str:
        """What the operator types to confirm ``preview``."""
        if self.sweep:
            return f"{self.name} {preview['count']}"
        if self.name == "forget" and params.get("entity"):
            return params["entity"]
        return params.get(self.needs, "")


def _target_of(params: Mapping[str, str], name: str) -> str:
    value = params.get(name, "")
    if not value:
        raise ConfigError(f"say which {name}")
    return value


def _older_than(params: Mapping[str, str]) -> float:
    return seconds(params.get("older_than") or "0s", "older than")


def _document(where: Where, done: operate.Action) -> dict[str, Any]:
    document = action_document.of(done, where.fields)
    if document.get("record"):
        document["record"] = masked(document["record"])
    return document


def _unlock(where: Where, params: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
    key = _target_of(params, "key")
    return _document(where, operate.unlock(where.target, key, dry_run=dry_run))


def _forget(where: Where, params: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
    if params.get("entity"):
        done = operate.forget_entity(where.target, params["entity"], dry_run=dry_run)
    else:
        done = operate.forget(where.target, _target_of(params, "key"), dry_run=dry_run)
    return _document(where, done)


def _unlock_stale(where: Where, params: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
    return _document(
        where, operate.unlock_stale(where.target, _older_than(params), dry_run=dry_run)
    )


def _purge(where: Where, params: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
    return _document(where, operate.purge(where.target, _older_than(params), dry_run=dry_run))


def _replay(where: Where, params: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
    import uuid

    from idemctl.operate.documents import outbox as outbox_documents
    from idemctl.outbox.replay import Replay
    from idemctl.outbox.table import Selection

    text = _target_of(params, "id")
    try:
        row_id = uuid.UUID(text)
    except ValueError:
        raise ConfigError(f"row id {text!r}: a UUID") from None
    chosen = Replay(store_of(where), Selection(ids=(row_id,)))
    chosen.table.check()
    if dry_run:
        rows = chosen.rows()
        return {
            "action": "replay", **where.fields, "dry_run": True, "count": len(rows),
            "rows": [outbox_documents.row(r, chosen.topic_of(r)) for r in rows],
        }  # fmt: skip
    report = chosen.send(where.brokers, where.kafka_config)
    document = outbox_documents.replay(where.fields, 1, report.sent, report.failed, report.marked)
    return {"action": "replay", "count": report.sent, **document}


ACTS = {
    act.name: act
    for act in (
        Act("unlock", "Unlock a key", "key", _unlock),
        Act("forget", "Forget", "key", _forget),
        Act("unlock-stale", "Unlock every stale key", "older_than", _unlock_stale),
        Act("purge", "Purge what is past retention", "older_than", _purge),
        Act("replay", "Replay an outbox row", "id", _replay),
    )
}


def act(name: str) -> Act:
    found = ACTS.get(name)
    if found is None:
        raise ConfigError(f"no action {name!r}: {', '.join(ACTS)}")
    return found
