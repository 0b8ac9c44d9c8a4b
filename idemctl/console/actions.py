"""The console's repairs: unlock a key, unlock every stale key, forget a key or an entity,
purge what is past retention, replay an outbox row, unlock or forget the keys picked in a
list. Each is the operate layer's action: asked for (GET) it runs as a dry run and shows
what it would do; confirmed (POST, the confirmation typed) it runs, and the operator log
says who did it and what came of it.

A confirmation is bound to its dry run (``previews``): the dry run hands out a preview
token holding what it showed, and the action acts only on that.

- A single key (entity, row) is acted on only if it is still in the state previewed
  (status, fencing token, attempts, the lease's end; an entity's sequence and holder);
  else nothing is done and the answer says what changed, with a new preview.
- A sweep (``unlock-stale``) acts only on the keys its dry run listed (at most ``LIMIT``,
  the first in key order), each still as previewed; it names those left alone: changed
  since, or stale now but never previewed.
- ``purge`` counts (the store lists no records past retention), so its preview binds its
  cutoff: the confirmation purges what was past retention at the preview's moment, never
  what ran out since.
- A bulk action acts on each key picked that its dry run would act on, each still as
  previewed, and says what came of each.

The typed confirmation names what it acts on: the key, the entity or the row's id; for a
sweep its verb and the count the dry run bound (``purge 1200``); for a bulk action the
verb and the count (``unlock 3 keys``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from idemctl import operate
from idemctl.console.previews import Asked
from idemctl.console.views import Where, masked, seconds, store_of
from idemctl.errors import ConfigError, IdemctlError
from idemctl.operate import repair
from idemctl.operate.documents import action as action_document
from idemctl.operate.documents import item as item_document
from idemctl.operate.repair import Changed, KeyOutcome, state_of

LIMIT = 500
"""Keys a sweep's or a bulk action's preview binds at most: a sweep that finds more acts
on the first ``LIMIT`` (in key order) and is run again for the rest."""


@dataclass(frozen=True)
class Dry:
    """A dry run: its document, what a confirmation of it binds, and the count it names."""

    document: dict[str, Any]
    bound: dict[str, Any]
    """``{"keys": {key: state}}``, ``{"entities": {...}}``, ``{"rows": {...}}``, or a
    purge's ``{"older_than": s, "at": t}``."""
    count: int


@dataclass(frozen=True)
class Acted:
    """What an action did: its document and each key's outcome."""

    document: dict[str, Any]
    outcomes: list[KeyOutcome] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    """A sweep's: keys it would take now that its preview never listed (left alone)."""


@dataclass(frozen=True)
class Repair:
    """One repair: its dry run and its run on what the dry run bound."""

    name: str
    title: str
    needs: str
    """What it acts on: key, entity (forget's other form), id, older_than (a sweep), or
    keys (a bulk action: ``key`` repeated)."""
    dry: Callable[[Where, Asked], Dry]
    run: Callable[[Where, Asked, Mapping[str, Any]], Acted]
    """Raises ``Changed`` where a single key is no longer as bound: nothing done."""
    verb: str = ""
    """A bulk action's, in its confirmation: ``unlock 3 keys``."""

    @property
    def sweep(self) -> bool:
        return self.needs == "older_than"

    @property
    def bulk(self) -> bool:
        return self.needs == "keys"

    def kind(self, params: Mapping[str, str]) -> str:
        """What it acts on, as the operator log types it: key, entity, row, sweep, keys."""
        if self.sweep:
            return "sweep"
        if self.bulk:
            return "keys"
        if self.name == "forget" and params.get("entity"):
            return "entity"
        return "row" if self.needs == "id" else "key"

    def subject(self, params: Mapping[str, str]) -> str:
        """What it acts on, in words: the key, ``entity E``, the row's id, ``older than D``
        for a sweep, ``N keys`` for a bulk action."""
        if self.sweep:
            return f"older than {params.get('older_than') or '0s'}"
        if self.bulk:
            return counted(len(getattr(params, "selection", ())))
        if self.name == "forget" and params.get("entity"):
            return f"entity {params['entity']}"
        return params.get(self.needs, "")

    def name_of(self, params: Mapping[str, str]) -> str:
        """What it acts on, bare: the key, the entity, the id; a sweep's or bulk's subject."""
        if self.name == "forget" and params.get("entity"):
            return params["entity"]
        return self.subject(params)

    def confirmation(self, count: int, params: Mapping[str, str]) -> str:
        """What the operator types to confirm a dry run that counted ``count``."""
        if self.sweep:
            return f"{self.name} {count}"
        if self.bulk:
            return f"{self.verb} {counted(count)}"
        return self.name_of(params)


def counted(n: int) -> str:
    return f"{n} key" if n == 1 else f"{n} keys"


# The dry runs and the runs ----------------------------------------------------------------


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


def _shown(record: Any) -> dict[str, Any]:
    """A record's document as the preview shows it (its result masked)."""
    return masked(item_document.document(record, datetime.now(UTC)))


def _one(bound: Mapping[str, Any], family: str, name: str) -> dict[str, Any]:
    found = bound.get(family, {}).get(name)
    if not isinstance(found, dict):
        raise ConfigError(f"the preview does not name {name!r}: preview it again")
    return found


def _unlock_dry(where: Where, asked: Asked) -> Dry:
    key = _target_of(asked, "key")
    before = operate.inspect(where.target, key)  # as it is now: the unlock's record is after
    document = _document(where, operate.unlock(where.target, key, dry_run=True))
    document["before"] = _shown(before)
    return Dry(document, {"keys": {key: state_of(before)}}, 1)


def _unlock_run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
    key = _target_of(asked, "key")
    done = operate.unlock(where.target, key, expect=_one(bound, "keys", key))
    return Acted(_document(where, done), [KeyOutcome(key, True, "freed")])


def _forget_dry(where: Where, asked: Asked) -> Dry:
    if asked.get("entity"):
        done = operate.forget_entity(where.target, asked["entity"], dry_run=True)
        assert done.entity is not None
        return Dry(
            _document(where, done), {"entities": {asked["entity"]: state_of(done.entity)}}, 1
        )
    key = _target_of(asked, "key")
    done = operate.forget(where.target, key, dry_run=True)  # the record as it is
    assert done.record is not None
    return Dry(_document(where, done), {"keys": {key: state_of(done.record)}}, 1)


def _forget_run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
    if asked.get("entity"):
        entity = asked["entity"]
        expect = _one(bound, "entities", entity)
        done = operate.forget_entity(where.target, entity, expect=expect)
        return Acted(_document(where, done), [KeyOutcome(entity, True, "forgot")])
    key = _target_of(asked, "key")
    done = operate.forget(where.target, key, expect=_one(bound, "keys", key))
    return Acted(_document(where, done), [KeyOutcome(key, True, "forgot")])


def _unlock_stale_dry(where: Where, asked: Asked) -> Dry:
    found = operate.unlock_stale(where.target, _older_than(asked), dry_run=True)
    states = repair.states_of(where.target, (found.keys or [])[:LIMIT])
    listed = replace(found, keys=list(states), count=len(states))
    document = {**_document(where, listed), "found": found.count, "limit": LIMIT}
    return Dry(document, {"keys": states}, len(states))


def _unlock_stale_run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
    expected: dict[str, Any] = bound.get("keys", {})
    outcomes = repair.unlock_each(where.target, expected)
    now = operate.unlock_stale(where.target, _older_than(asked), dry_run=True)
    appeared = [k for k in now.keys or [] if k not in expected][:LIMIT]
    return Acted(_acted(where, "unlock", outcomes, where.target.skipped), outcomes, appeared)


def _acted(
    where: Where, action: str, outcomes: list[KeyOutcome], skipped: int | None = None
) -> dict[str, Any]:
    keys = [o.key for o in outcomes if o.done]
    return action_document.document(
        action, where.fields, dry_run=False, count=len(keys), keys=keys, skipped=skipped
    )


def _purge_dry(where: Where, asked: Asked) -> Dry:
    older = _older_than(asked)
    at = time.time()  # before the store judges: the cutoff is at most this far back
    done = operate.purge(where.target, older, dry_run=True)
    return Dry(_document(where, done), {"older_than": older, "at": at}, done.count)


def _purge_run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
    """What was past retention at the preview: the preview's ``older_than`` plus the time
    since (by this console's clock; the store judges by its own, which runs as fast), so
    that nothing whose retention ran out after the preview goes, to within the time a
    store call takes to read its clock."""
    since = max(0.0, time.time() - float(bound["at"]))
    return Acted(_document(where, operate.purge(where.target, float(bound["older_than"]) + since)))


def _replay_of(where: Where, asked: Asked) -> Any:
    from idemctl.outbox.table import Selection

    text = _target_of(asked, "id")
    try:
        row_id = uuid.UUID(text)
    except ValueError:
        raise ConfigError(f"row id {text!r}: a UUID") from None
    return operate.outbox_replay(store_of(where), Selection(ids=(row_id,)))


def _row_state(row: Any) -> dict[str, Any]:
    return {"published_at": row.to_json()["published_at"]}


def _replay_dry(where: Where, asked: Asked) -> Dry:
    from idemctl.operate.documents import outbox as outbox_documents

    chosen = _replay_of(where, asked)
    rows = chosen.rows()
    document = {
        "action": "replay", **where.fields, "dry_run": True, "count": len(rows),
        "rows": [outbox_documents.row(r, chosen.topic_of(r)) for r in rows],
    }  # fmt: skip
    return Dry(document, {"rows": {str(r.id): _row_state(r) for r in rows}}, len(rows))


def _replay_run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
    from idemctl.operate.documents import outbox as outbox_documents

    chosen = _replay_of(where, asked)
    row_id = _target_of(asked, "id")
    expect = _one(bound, "rows", row_id)
    rows = {str(r.id): _row_state(r) for r in chosen.rows()}
    if rows.get(row_id) != expect:
        raise Changed(row_id, expect, rows.get(row_id), "row")
    report = chosen.send(where.brokers, where.kafka_config)
    document = outbox_documents.replay(where.fields, 1, report.sent, report.failed, report.marked)
    outcome = KeyOutcome(row_id, report.sent > 0, "replayed" if report.sent else "not sent")
    return Acted({"action": "replay", "count": report.sent, **document}, [outcome])


def _picked(asked: Asked) -> list[str]:
    if not asked.selection:
        raise ConfigError("pick the keys to act on (key=K, repeated)")
    if len(asked.selection) > LIMIT:
        raise ConfigError(f"{len(asked.selection)} keys picked: at most {LIMIT} at once")
    return list(asked.selection)


def _bulk_dry(action: str) -> Callable[[Where, Asked], Dry]:
    """Each key picked: its record as it is now, and whether ``action`` would act on it
    (the single action's dry run: its refusal in words)."""
    single = operate.unlock if action == "unlock" else operate.forget

    def dry(where: Where, asked: Asked) -> Dry:
        items, bound = [], {}
        for key in _picked(asked):
            record = where.target.get(key)
            item: dict[str, Any] = {"key": key, "record": None, "would": False, "why": None}
            if record is None:
                item["why"] = f"no record for key {key!r}"
            else:
                item["record"] = _shown(record)
                try:
                    single(where.target, key, dry_run=True)
                except IdemctlError as exc:
                    item["why"] = str(exc)
                else:
                    item["would"] = True
                    bound[key] = state_of(record)
            items.append(item)
        document = action_document.document(
            action, where.fields, dry_run=True, count=len(bound), keys=list(bound)
        )
        return Dry({**document, "items": items}, {"keys": bound}, len(bound))

    return dry


def _bulk_run(action: str) -> Callable[[Where, Asked, Mapping[str, Any]], Acted]:
    each = repair.unlock_each if action == "unlock" else repair.forget_each

    def run(where: Where, asked: Asked, bound: Mapping[str, Any]) -> Acted:
        outcomes = each(where.target, bound.get("keys", {}))
        return Acted(_acted(where, action, outcomes), outcomes)

    return run


ACTS = {
    act.name: act
    for act in (
        Repair("unlock", "Unlock a key", "key", _unlock_dry, _unlock_run),
        Repair("forget", "Forget", "key", _forget_dry, _forget_run),
        Repair("unlock-stale", "Unlock every stale key", "older_than", _unlock_stale_dry,
            _unlock_stale_run),
        Repair("purge", "Purge what is past retention", "older_than", _purge_dry, _purge_run),
        Repair("replay", "Replay an outbox row", "id", _replay_dry, _replay_run),
        Repair("bulk-unlock", "Unlock the keys picked", "keys", _bulk_dry("unlock"),
            _bulk_run("unlock"), verb="unlock"),
        Repair("bulk-forget", "Forget the keys picked", "keys", _bulk_dry("forget"),
            _bulk_run("forget"), verb="forget"),
    )
}  # fmt: skip


def act(name: str) -> Repair:
    found = ACTS.get(name)
    if found is None:
        raise ConfigError(f"no action {name!r}: {', '.join(ACTS)}")
    return found
