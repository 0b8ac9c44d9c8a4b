"""What a key's record means for the operator looking at it in an incident: its state in a
word (stale, held, released, completed, failed, ...), since when, whose lease, what the
next delivery of its message does, and what they may do about it.

It reads the record's document (``inspect --json``, masked or not) as the page shows it,
and judges it by the same rules as the store (``idemctl.model.Record``, the claim rules of
``idemctl.stores.machine``; Powertools' states for its layout). Each sentence is ``Html``,
every value in it escaped (``display``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from idemctl.console.display import Html, ago, clock, fill, moment, since


@dataclass(frozen=True)
class Meaning:
    state: str
    """In a word: stale, held, released, completed, failed, failed for good, past retention
    (Powertools: its states)."""
    tone: str
    """How the page colours it: ok, warn, fail."""
    said: list[Html] = field(default_factory=list)
    """What the state means: since when, whose lease, what the next delivery does."""
    todo: list[Html] = field(default_factory=list)
    """What the operator may do, and what it does."""


def meaning(doc: Mapping[str, Any], now: datetime | None = None) -> Meaning:
    """What ``doc`` (a key's document) means at ``now``."""
    now = now or datetime.now(UTC)
    if "state" in doc and "expiration" in doc:
        return _powertools(doc, now)
    expires = moment(doc.get("expires_at"))
    if expires is not None and expires <= now:
        return Meaning(
            "past retention", "ok",
            [fill("Its retention ended {}: the store treats the key as never seen, and the "
                  "next delivery runs the handler afresh.", ago(expires, now))],
            [Html("Nothing is needed: the store's expiry (or a purge) deletes it.")],
        )  # fmt: skip
    status = doc.get("status")
    if status == "completed":
        return _completed(doc, now)
    if status == "failed":
        return _failed(doc, now)
    if status == "in_progress":
        return _in_progress(doc, now)
    return Meaning(str(status), "warn", [fill("Status {}.", status)])


def _retention(doc: Mapping[str, Any], now: datetime) -> Html:
    expires = doc.get("expires_at")
    return fill(", until its retention ends {}", ago(expires, now)) if expires else Html("")


def _completed(doc: Mapping[str, Any], now: datetime) -> Meaning:
    return Meaning(
        "completed", "ok",
        [fill("Completed {} (attempt {}).", ago(doc.get("completed_at"), now), doc.get("attempts")),
         fill("The next delivery of this key returns the stored result without running the "
              "handler{}.", _retention(doc, now))],
        [Html("Nothing is needed. Forget would make the next delivery run the handler again: "
              "its effect would happen twice.")],
    )  # fmt: skip


def _failed(doc: Mapping[str, Any], now: datetime) -> Meaning:
    error = doc.get("error") or "(no error recorded)"
    at = ago(doc.get("updated_at"), now)
    attempt = doc.get("attempts")
    if doc.get("retriable"):
        return Meaning(
            "failed", "warn",
            [fill('Failed {} on attempt {}: <q class="error" id="meaning-error">{}</q>', at,
                  attempt, error),
             fill("It will be retried: the next delivery of this key runs the handler again, "
                  "as attempt {}.", _next(attempt))],
            [Html("If its message will not be delivered again (its group committed past it), "
                  "nothing retries it: deliver it again, once the cause is fixed.")],
        )  # fmt: skip
    return Meaning(
        "failed for good", "fail",
        [fill('Failed for good {} on attempt {}: <q class="error" id="meaning-error">{}</q>',
              at, attempt, error),
         fill("It will not be retried: the next delivery of this key gets this failure back "
              "without running the handler{}.", _retention(doc, now))],
        [Html("To run it again, fix the cause, then forget the key: the next delivery runs the "
              "handler afresh.")],
    )  # fmt: skip


def _next(attempt: Any) -> Any:
    return attempt + 1 if isinstance(attempt, int) else "the next"


def _in_progress(doc: Mapping[str, Any], now: datetime) -> Meaning:
    owner, attempt, token = doc.get("owner"), doc.get("attempts"), doc.get("fencing_token")
    lease = doc.get("lease_expires_at")
    ends = moment(lease)
    if owner is None:
        return Meaning(
            "released", "warn",
            [fill("Released {}: in progress with no owner (an unlock, or a worker that let it "
                  "go), after {} attempt(s).", ago(doc.get("updated_at"), now), attempt),
             fill("The next delivery of this key claims it at once and runs the handler, as "
                  "attempt {}, with fencing token {}.", _next(attempt), _next(token))],
            [Html("Nothing runs it until then: if its message will not be delivered again (its "
                  "group committed past it), deliver it again.")],
        )  # fmt: skip
    if ends is not None and ends > now:
        return Meaning(
            "held", "ok",
            [fill('Held by owner <code id="meaning-owner">{}</code>, running attempt {}; its '
                  "lease ends {}.", owner, attempt, ago(lease, now)),
             Html("The next delivery of this key waits for it (busy). If the worker is gone, "
                  "the key turns stale when the lease ends, and the delivery after takes it "
                  "over.")],
            [Html("Wait: unlocking a live lease would let a second worker run the handler "
                  "alongside the first (the console refuses it; the CLI asks for --force).")],
        )  # fmt: skip
    return Meaning(
        "stale", "fail",
        [fill('<strong id="stale-for">Stale for {}</strong>, since {}: the lease of owner '
              '<code id="meaning-owner">{}</code> (attempt {}, fencing token {}) ran out and '
              "nobody finished or freed the key: its worker has likely died.",
              since(lease, now), clock(lease, now), owner, attempt, token),
         fill("The next delivery of this key takes it over and runs the handler again, as "
              "attempt {}.", _next(attempt))],
        [fill("Unlock frees it now: the key is released (in progress, no owner), the old "
              "owner can no longer complete it (the next claim gets fencing token {}), and "
              "the next delivery claims it at once and runs the handler.", _next(token))],
    )  # fmt: skip


POWERTOOLS = {
    "completed": ("ok", "The next call with the same payload returns the stored data without "
                  "running the function, until its expiration {}."),
    "in_progress": ("ok", "A live invocation holds it: calls with the same payload fail with "
                    "IdempotencyAlreadyInProgressError until its in-progress expiry {}."),
    "stale": ("fail", "Stale: its in-progress expiry passed {}, so its invocation is over "
              "(timed out or crashed); Powertools takes the record over on the next call."),
    "blocked": ("fail", "Blocked: in progress with no in-progress expiry (no Lambda context "
                "was registered); every call with the payload fails with "
                "IdempotencyAlreadyInProgressError until its expiration {}."),
    "expired": ("ok", "Expired {}: Powertools treats it as absent, and the next call runs the "
                "function; TTL (or a purge) deletes it."),
    "invalid": ("fail", "No record Powertools wrote{}: every call passes it over."),
}  # fmt: skip
"""Powertools' states: the page's tone, and what it means (its time's place)."""


def _powertools(doc: Mapping[str, Any], now: datetime) -> Meaning:
    state = str(doc.get("state"))
    tone, text = POWERTOOLS.get(state, ("warn", "State {}."))
    when = doc.get("in_progress_expiration") if state in ("in_progress", "stale") else None
    at = ago(when or doc.get("expiration"), now) if state != "invalid" else Html("")
    said = [fill(text, at)]
    problems = doc.get("problems") or []
    said += [fill("{}", p) for p in problems]
    todo = []
    if state in ("stale", "blocked"):
        todo.append(Html("Unlock frees it now: the next call runs the function."))
    return Meaning(state, tone, said, todo)
