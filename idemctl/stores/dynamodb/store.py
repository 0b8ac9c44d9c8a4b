"""DynamoDBStore: the claim/complete protocol, each operation one conditional write."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from idemctl.errors import ConfigError, LeaseLost
from idemctl.model import (
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Holder,
    Record,
    canonical_json,
)
from idemctl.stores.base import new_owner
from idemctl.stores.dynamodb.admin import DynamoDBAdmin
from idemctl.stores.dynamodb.core import DEFAULT_CONCURRENCY
from idemctl.stores.dynamodb.items import (
    first_token,
    from_ms,
    is_entity_key,
    n,
    s,
    shard_of,
    to_ms,
    to_record,
    value_of,
)
from idemctl.stores.dynamodb.provision import DynamoDBProvisioning
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION, LEASE_RANGE, RETENTION_RANGE
from idemctl.stores.machine import decide_claim, lease_lost
from idemctl.urls import UrlOptions, redact_url

TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
"""What DynamoDB accepts as a table name (older botocore refuses shorter names itself, with
a less helpful message; newer ones leave it to the service)."""


class DynamoDBStore(DynamoDBAdmin, DynamoDBProvisioning):
    scheme = "dynamodb"

    @classmethod
    def from_url(cls, url: str) -> DynamoDBStore:
        options = UrlOptions(url)
        table = options.parts.netloc or options.parts.path.strip("/")
        if options.parts.netloc and options.parts.path.strip("/"):
            raise ConfigError(
                f"DynamoDB URL {redact_url(url)}: nothing may follow the table name "
                f"({options.parts.path!r}): dynamodb://TABLE?region=..."
            )
        if not TABLE_NAME.fullmatch(table):
            raise ConfigError(
                f"DynamoDB URL {redact_url(url)} names no table DynamoDB allows "
                f"({table!r}: 3 to 255 of a-z, A-Z, 0-9, '_', '-', '.'): dynamodb://TABLE?..."
            )
        settings: dict[str, Any] = {
            "region": options.text("region"),
            "endpoint_url": options.text("endpoint_url"),
            "lease": options.duration("lease", DEFAULT_LEASE, *LEASE_RANGE),
            "retention": options.duration("retention", DEFAULT_RETENTION, *RETENTION_RANGE),
            "connect_timeout": options.duration("connect_timeout", 2.0, 0.001),
            "read_timeout": options.duration("read_timeout", 5.0, 0.001),
            "max_attempts": options.whole("max_attempts", 3, minimum=1),
            "concurrency": options.whole("concurrency", DEFAULT_CONCURRENCY, minimum=1),
        }
        options.finish()
        return cls(table, url=url, **settings)

    def _claim_one(self, key: str, fingerprint: str | None, lease: float) -> ClaimOutcome:
        now, owner = self._now(), new_owner()
        first = first_token()
        lease_ms = to_ms(lease)
        expires = now + lease_ms
        values: dict[str, Any] = {
            ":now": n(now),
            ":inprog": s("in_progress"),
            ":failed": s("failed"),
            ":true": {"BOOL": True},
            ":owner": s(owner),
            ":one": n(1),
            ":zero": n(0),
            ":lease": n(expires),
            ":ttl": n((expires + to_ms(self.default_retention)) // 1000),
            ":tok0": n(first - 1),
            ":ips": shard_of(key),
        }
        sets = (
            "SET #st = :inprog, #ow = :owner, #tok = if_not_exists(#tok, :tok0) + :one, "
            "#att = if_not_exists(#att, :zero) + :one, #lease = :lease, "
            "#cr = if_not_exists(#cr, :now), #up = :now, #ttl = :ttl, #ips = :ips"
        )
        fp_check = ""
        if fingerprint is not None:
            values[":fp"] = s(fingerprint)
            sets += ", #fp = if_not_exists(#fp, :fp)"
            fp_check = " AND (attribute_not_exists(#fp) OR #fp = :fp)"
        update = sets + " REMOVE #exp, #done, #by"
        # Absent; or within retention, with no other fingerprint, and either in progress
        # with its lease ended (or released) or failed retriably.
        condition = (
            "attribute_not_exists(#k) OR ((attribute_not_exists(#exp) OR #exp > :now)"
            f"{fp_check} AND ((#st = :inprog AND (attribute_not_exists(#ow) OR #lease <= :now))"
            " OR (#st = :failed AND #retr = :true)))"
        )
        try:
            old = self._update(key, update, condition, values, "ALL_OLD")
        except ClientError as exc:
            item = exc.response.get("Item")
            if not item:  # gone between the condition and now: try once more
                return self._renew(key, fingerprint, lease_ms, owner, None) or Busy(None)
            record = to_record(item)
            if record.owner == owner and record.lease_expires_at is not None:
                # This very claim, sent again by botocore after its answer was lost. Whether
                # it took over is not on the item: say so when an attempt came before it.
                return Acquired(
                    key,
                    owner,
                    record.fencing_token,
                    record.attempts,
                    record.lease_expires_at,
                    takeover=record.attempts > 1,
                )
            if record.retention_over(from_ms(now) or datetime.now(UTC)):
                return self._renew(key, fingerprint, lease_ms, owner, record) or Busy(record)
            outcome, _ = decide_claim(
                record, key, fingerprint, from_ms(now) or datetime.now(UTC), 0.0
            )
            return Busy(record) if isinstance(outcome, Acquired) else outcome
        old_token = value_of(old, "fencing_token")
        token = first if old_token is None else old_token + 1
        attempts = (value_of(old, "attempts") or 0) + 1
        takeover = value_of(old, "status") == "in_progress"
        lease_at = from_ms(expires)
        assert lease_at is not None
        return Acquired(key, owner, token, attempts, lease_at, takeover=takeover)

    def _renew(
        self, key: str, fingerprint: str | None, lease_ms: int, owner: str, old: Record | None
    ) -> Acquired | None:
        """A key past retention (or forgotten) starts a new life: attempts 1, the fencing
        counter going on; with no item at all, starting at the clock (``first_token``).
        Conditional on the old item being what was read; None when somebody was faster."""
        now = self._now()
        expires = now + lease_ms
        values: dict[str, Any] = {
            ":now": n(now),
            ":inprog": s("in_progress"),
            ":owner": s(owner),
            ":one": n(1),
            ":lease": n(expires),
            ":ttl": n((expires + to_ms(self.default_retention)) // 1000),
            ":ips": shard_of(key),
        }
        token = first_token() if old is None else old.fencing_token + 1
        values[":tok"] = n(token)
        update = (
            "SET #st = :inprog, #ow = :owner, #tok = :tok, #att = :one, #lease = :lease, "
            "#cr = :now, #up = :now, #ttl = :ttl, #ips = :ips"
        )
        if fingerprint is not None:
            values[":fp"] = s(fingerprint)
            update += ", #fp = :fp REMOVE #exp, #done, #by, #res, #err, #retr"
        else:
            update += " REMOVE #exp, #done, #by, #res, #err, #retr, #fp"
        if old is None:
            condition = "attribute_not_exists(#k)"
        else:
            values[":oldtok"] = n(old.fencing_token)
            condition = "#tok = :oldtok AND #exp <= :now"
        try:
            self._update(key, update, condition, values, "NONE")
        except ClientError:
            return None
        lease_at = from_ms(expires)
        assert lease_at is not None
        return Acquired(key, owner, token, 1, lease_at, takeover=False)

    def _held(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        update: str,
        values: dict[str, Any],
        retried: str | None = None,
    ) -> Record:
        """An update only the holder may make: LeaseLost otherwise. ``retried`` names the
        status a repeat of this very request would have left (botocore retries requests)."""
        values = {
            **values,
            ":owner": s(owner),
            ":tok": n(fencing_token),
            ":inprog": s("in_progress"),
        }
        condition = "(#ow = :owner AND #tok = :tok AND #st = :inprog)"
        if retried:
            values[":again"] = s(retried)
            condition += " OR (#by = :owner AND #tok = :tok AND #st = :again)"
        try:
            return to_record(self._update(key, update, condition, values, "ALL_NEW"))
        except ClientError as exc:
            item = exc.response.get("Item")
            record = to_record(item) if item and not is_entity_key(key) else None
            raise lease_lost(key, owner, fencing_token, record) from None

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        def claim(i: int) -> ClaimOutcome:
            return self._claim_one(requests[i].key, requests[i].fingerprint, lease)

        return self._each([r.key for r in requests], claim)

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        def complete(i: int) -> bool:
            c = completions[i]
            try:
                self.complete(c.key, c.owner, c.fencing_token, c.result, retention)
            except LeaseLost:
                return False
            return True

        return self._each([c.key for c in completions], complete)

    def _ending(self, retention: float) -> dict[str, Any]:
        """What a completion and a failure both set: now, and when the record's retention
        ends (``expires_at``, and the TTL attribute in seconds)."""
        now = self._now()
        expires = now + to_ms(retention)
        return {":now": n(now), ":exp": n(expires), ":ttl": n(expires // 1000)}

    def _complete(self, c: Completion, retention: float) -> Record:
        key, owner, fencing_token, result = c.key, c.owner, c.fencing_token, c.result
        values = {
            **self._ending(retention),
            ":done": s("completed"),
            ":res": s(canonical_json(result).decode()),
            ":false": {"BOOL": False},
        }
        update = (
            "SET #st = :done, #done = :now, #up = :now, #exp = :exp, #ttl = :ttl, #res = :res, "
            "#retr = :false, #by = :owner REMOVE #ow, #lease, #err, #ips"
        )
        record = self._held(key, owner, fencing_token, update, values, retried="completed")
        self._moved((key,))  # this process's waiters, at once (others poll)
        return record

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        key, owner, fencing_token = held.key, held.owner, held.fencing_token
        values = {
            **self._ending(retention),
            ":failed": s("failed"),
            ":err": s(error),
            ":retr": {"BOOL": retriable},
        }
        update = (
            "SET #st = :failed, #up = :now, #exp = :exp, #ttl = :ttl, #err = :err, "
            "#retr = :retr, #by = :owner REMOVE #ow, #lease, #ips"
        )
        record = self._held(key, owner, fencing_token, update, values, retried="failed")
        self._moved((key,))
        return record

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        now = self._now()
        expires = now + to_ms(self.lease_for(lease))
        values = {
            ":now": n(now),
            ":lease": n(expires),
            ":ttl": n((expires + to_ms(self.default_retention)) // 1000),
        }
        record = self._held(
            key, owner, fencing_token, "SET #lease = :lease, #up = :now, #ttl = :ttl", values
        )
        assert record.lease_expires_at is not None
        return record.lease_expires_at

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        now = self._now()
        values = {":now": n(now)}
        update = "SET #lease = :now, #up = :now, #by = :owner REMOVE #ow"
        if handler_ran:
            record = self._held(key, owner, fencing_token, update, values, retried="in_progress")
            self._moved((key,))
            return record
        # Taking the attempt back is not idempotent, so a request botocore repeats after a
        # lost answer must not count as this owner's: it then reports LeaseLost, and the key
        # is released all the same.
        values[":one"] = n(1)
        update = "SET #lease = :now, #up = :now, #by = :owner, #att = #att - :one REMOVE #ow"
        record = self._held(key, owner, fencing_token, update, values)
        self._moved((key,))
        return record
