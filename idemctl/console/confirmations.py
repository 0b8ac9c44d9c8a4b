"""A dry run's preview, its confirmation and what came of it: ``preview`` runs an
action's dry run and signs what it showed (``previews``); ``confirmed`` checks that a
confirmation sends that preview back and types what it asks; ``perform`` acts on what the
preview bound; ``log_before`` and ``log_after`` write the operator log's lines around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from idemctl.console.actions import Acted, Dry, Repair
from idemctl.console.display import plain
from idemctl.console.oplog import Entry, OperatorLog, OperatorLogUnwritable
from idemctl.console.previews import SIGNER, Asked
from idemctl.console.views import Where
from idemctl.errors import IdemctlError
from idemctl.operate.repair import Changed, KeyOutcome, what_changed

# Previews, confirmations and what came of them -------------------------------------------


@dataclass(frozen=True)
class Preview:
    """A dry run as shown: its document, the confirmation it asks for, its token."""

    act: Repair
    asked: Asked
    dry: Dry
    confirm: str
    token: str

    def to_json(self) -> dict[str, Any]:
        """The dry run's document and everything its confirmation sends back: ``confirm``
        (typed), ``preview``, the ``fields`` (and a bulk action's ``selection``, as ``key``
        repeated)."""
        return {
            **self.dry.document, "confirm": self.confirm, "preview": self.token,
            "fields": dict(self.asked.fields), "selection": list(self.asked.selection),
            "bound": self.dry.bound,
        }  # fmt: skip


def preview(chosen: Repair, where: Where, asked: Asked, user: str) -> Preview:
    """``chosen``'s dry run on ``asked``, for ``user``, with its signed token."""
    dry = chosen.dry(where, asked)
    confirm = chosen.confirmation(dry.count, asked)
    token = SIGNER.sign({
        "action": chosen.name, "user": user, "fields": asked.fields,
        "selection": list(asked.selection), "count": dry.count, "confirm": confirm,
        "bound": dry.bound,
    })  # fmt: skip
    return Preview(chosen, asked, dry, confirm, token)


@dataclass(frozen=True)
class Refusal:
    """A confirmation that did nothing: why, what changed since its preview, and the dry
    run as the store stands now (``preview``; None where the dry run itself now fails,
    ``failure`` saying why)."""

    status: int
    kind: str
    """``unbound`` (no preview of this console's, or of another action), ``mistyped``,
    ``changed``."""
    message: str
    changes: list[tuple[str, str]]
    """(key, entity or row; what changed)."""
    preview: Preview | None
    failure: str | None = None

    def to_json(self) -> dict[str, Any]:
        fresh = self.preview.to_json() if self.preview else {"count": 0}
        return {
            **fresh, "done": False, "refused": self.kind, "error": self.message,
            "changed": [{"name": n, "said": s} for n, s in self.changes],
            **({"failure": self.failure} if self.failure else {}),
        }  # fmt: skip


def _refused(
    chosen: Repair,
    where: Where,
    asked: Asked,
    user: str,
    status: int,
    kind: str,
    message: str,
    changes: list[tuple[str, str]] | None = None,
    bound: Mapping[str, Any] | None = None,
) -> Refusal:
    """A refusal with a new preview; ``bound``: what the refused one bound, to say what
    changed since."""
    try:
        fresh: Preview | None = preview(chosen, where, asked, user)
    except IdemctlError as exc:
        return Refusal(status, kind, message, changes or [], None, str(exc))
    if bound is not None and fresh is not None and not changes:
        changes = _changes(bound, fresh.dry.bound)
    return Refusal(status, kind, message, changes or [], fresh)


def _changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What differs between two previews' bound states."""
    found: list[tuple[str, str]] = []
    for family in ("keys", "entities", "rows"):
        old, new = before.get(family) or {}, now.get(family) or {}
        found += [(name, what_changed(state, new.get(name)))
                  for name, state in old.items() if new.get(name) != state]  # fmt: skip
        found += [(name, "not in the preview; now in this one") for name in new if name not in old]
    return found


@dataclass(frozen=True)
class Confirmed:
    """A confirmation that matched its preview: what it will act on."""

    act: Repair
    asked: Asked
    user: str
    payload: dict[str, Any]

    @property
    def previewed(self) -> int:
        return int(self.payload.get("count", 0))


def confirmed(
    chosen: Repair, where: Where, asked: Asked, user: str, typed: str, token: str
) -> Refusal | Confirmed:
    """The plan a confirmation binds, or why nothing will be done (with a new preview)."""
    payload = SIGNER.read(token)
    if payload is None:
        return _refused(chosen, where, asked, user, 400, "unbound",
                        "nothing was done: this confirmation carries no preview of this "
                        "console (none sent, or the console restarted since): confirm the "
                        "dry run below")  # fmt: skip
    if (payload.get("action"), payload.get("user"), payload.get("fields"),
            payload.get("selection")) != (chosen.name, user, asked.fields,
                                          list(asked.selection)):  # fmt: skip
        return _refused(chosen, where, asked, user, 400, "unbound",
                        "nothing was done: the preview sent back is of another action, "
                        "target or operator: confirm the dry run below")  # fmt: skip
    expected = str(payload.get("confirm", ""))
    if typed not in (expected, plain(expected)):
        return _refused(chosen, where, asked, user, 400, "mistyped",
                        "the confirmation did not match: nothing was done",
                        bound=payload.get("bound", {}))  # fmt: skip
    return Confirmed(chosen, asked, user, payload)


@dataclass(frozen=True)
class Done:
    """What a confirmed action did."""

    plan: Confirmed
    ran: Acted
    error: str | None = None

    @property
    def left_alone(self) -> list[KeyOutcome]:
        """The keys it did not act on: changed since their preview, refused, or (a sweep)
        stale now but never previewed."""
        alone = [o for o in self.ran.outcomes if not o.done]
        return alone + [KeyOutcome(k, False, "left alone: not in the preview")
                        for k in self.ran.appeared]  # fmt: skip

    @property
    def count(self) -> int:
        return int(self.ran.document.get("count", 0))

    @property
    def result(self) -> str:
        """In the operator log's words: ``3 done``, ``2 done, 1 left alone``, ``refused:
        ...``."""
        if self.error is not None:
            return f"refused: {self.error}"
        words = f"{self.count} done"
        alone = len(self.left_alone)
        if self.plan.act.name == "purge":
            alone = max(self.plan.previewed - self.count, 0)
        return f"{words}, {alone} left alone" if alone else words

    @property
    def whole(self) -> bool:
        """Whether it did all its preview showed, and nothing stayed to tell key by key."""
        return self.error is None and not self.left_alone and not self.plan.act.bulk

    def each(self) -> list[KeyOutcome]:
        """Each key's outcome, for the operator log: a sweep's and a bulk action's."""
        if not (self.plan.act.sweep or self.plan.act.bulk):
            return []
        return self.ran.outcomes + [KeyOutcome(k, False, "left alone: not in the preview")
                                    for k in self.ran.appeared]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error, "done": False}
        return {
            **self.ran.document, "done": True, "previewed": self.plan.previewed,
            "outcomes": [outcome_json(o) for o in self.ran.outcomes],
            "left_alone": [outcome_json(o) for o in self.left_alone],
            "appeared": self.ran.appeared,
        }  # fmt: skip


def outcome_json(outcome: KeyOutcome) -> dict[str, Any]:
    return {"key": outcome.key, "done": outcome.done, "said": outcome.said, "now": outcome.now}


def perform(plan: Confirmed, where: Where) -> Done | Refusal:
    """Run ``plan``: what it did, or, where a single key changed since its preview, a
    refusal saying what changed (nothing done) with the new preview."""
    chosen, asked = plan.act, plan.asked
    try:
        ran = chosen.run(where, asked, plan.payload.get("bound", {}))
    except Changed as exc:
        changes = [(exc.name, what_changed(exc.previewed, exc.now))]
        return _refused(chosen, where, asked, plan.user, 409, "changed",
                        f"nothing was done: the {exc.noun} changed since its preview",
                        changes)  # fmt: skip
    except IdemctlError as exc:
        return Done(plan, Acted({}), str(exc))
    return Done(plan, ran)


# The operator log ---------------------------------------------------------------------------


def log_before(oplog: OperatorLog, plan: Confirmed, address: str | None) -> Entry:
    """The line written before ``plan`` acts (``started``, its target typed, a sweep's or a
    bulk action's keys as previewed): ``OperatorLogUnwritable`` when it cannot be written,
    and then nothing is done."""
    chosen, asked = plan.act, plan.asked
    keys = list(plan.payload.get("bound", {}).get("keys") or [])
    many = chosen.sweep or chosen.bulk
    return oplog.started(plan.user, chosen.name, chosen.name_of(asked), kind=chosen.kind(asked),
                         address=address, keys=keys if many and keys else None)  # fmt: skip


@dataclass(frozen=True)
class Logged:
    """The lines written after an action: its own (``finished``), then each key's of a
    sweep or a bulk action; ``error`` where one could not be written (the action is done,
    its record lacks that end)."""

    entries: list[dict[str, Any]]
    error: str | None = None


def log_after(oplog: OperatorLog, started: Entry, plan: Confirmed, done: Done | Refusal) -> Logged:
    """What came of ``plan``, on the ``started`` line's id: the result (a refusal says what
    changed) with the keys acted on, then a line for each key of a sweep or a bulk action."""
    entries: list[dict[str, Any]] = []
    try:
        if isinstance(done, Refusal):
            said = "; ".join(f"{name}: {what}" for name, what in done.changes)
            result = f"nothing done, changed since its preview: {said}"
            entries.append(oplog.finished(started, result).to_json())
            return Logged(entries)
        acted = done.ran.document.get("keys") if plan.act.sweep or plan.act.bulk else None
        entries.append(oplog.finished(started, done.result, keys=acted).to_json())
        for outcome in done.each():
            entries.append(oplog.write(plan.user, plan.act.name, outcome.key, outcome.said,
                                       kind="key", address=started.address,
                                       id=started.id).to_json())  # fmt: skip
    except OperatorLogUnwritable as exc:
        return Logged(entries, str(exc))
    return Logged(entries)
