"""``dynamodb://TABLE?region=...&endpoint_url=...``: the store with no server to run.

A new key costs two requests (claim, complete) and a duplicate one, as Powertools for AWS
Lambda's idempotency layer does: claim is one conditional UpdateItem that answers a
conflict with the existing item (``ReturnValuesOnConditionCheckFailure=ALL_OLD``).
Unlike Powertools, complete, fail, extend and release check the owner and fencing token.

Time is the client's clock (DynamoDB has none to ask): leases and retention tolerate the
skew between workers' clocks, which NTP keeps to milliseconds. DynamoDB's TTL deletes
expired items hours late, so expiry is judged here, by ``expires_at``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from idemctl.errors import (
    ConfigError,
    InvalidCursor,
    KeyNotFound,
    LeaseLost,
    NotProvisioned,
    StoreError,
    StoreUnavailable,
)
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Finding,
    Page,
    Provisioning,
    Record,
    Stats,
    Status,
    canonical_json,
)
from idemctl.resources import read_resource
from idemctl.stores.base import (
    CLOCK_SKEW_TOLERANCE,
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    BaseStore,
    Progress,
    Query,
    new_owner,
    scan_query,
    stats_of,
)
from idemctl.stores.machine import check_forgettable, decide_claim, lease_lost, unlocked

ITEMS_PER_BATCH = 100
DEFAULT_CONCURRENCY = 16
"""Requests of one claim_many or complete_many in flight at once (URL option concurrency=)."""
T = TypeVar("T")

NAMES = {
    "#k": "key", "#st": "status", "#fp": "fingerprint", "#ow": "owner", "#tok": "fencing_token",
    "#att": "attempts", "#lease": "lease_expires_at", "#cr": "created_at", "#up": "updated_at",
    "#done": "completed_at", "#exp": "expires_at", "#ttl": "ttl", "#res": "result",
    "#err": "error", "#retr": "retriable", "#by": "done_by",
}  # fmt: skip


# Left after botocore's own retries: the store is there but cannot serve now.
_TRANSIENT = (
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "ServiceUnavailable",
)  # fmt: skip


# The endpoint refused the request's credentials or signature, or this identity's rights.
_REFUSED = (
    "UnrecognizedClientException", "InvalidSignatureException", "AccessDeniedException",
    "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredTokenException",
    "MissingAuthenticationTokenException", "IncompleteSignatureException",
    "InvalidAccessKeyId", "AuthFailure",
)  # fmt: skip


def _error_of(exc: ClientError) -> tuple[str, str]:
    """An error reply's code and message. An endpoint that answers in AWS's XML error form
    (moto refusing credentials does) has them inside the message."""
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
    inner = re.search(r"<Code>([^<]*)</Code>", message)
    if inner:
        said = re.search(r"<Message>([^<]*)</Message>", message)
        code, message = inner.group(1), said.group(1) if said else ""
    return code, message


def _names(expression: str) -> dict[str, str]:
    """The ExpressionAttributeNames an expression uses (DynamoDB refuses unused ones)."""
    return {name: NAMES[name] for name in set(re.findall(r"#\w+", expression))}


def _ms(at: float) -> int:
    return round(at * 1000)


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _start_key(cursor: str | None) -> dict[str, Any] | None:
    """The ExclusiveStartKey a ``scan`` cursor stands for."""
    if not cursor:
        return None
    try:
        start = json.loads(cursor)
        if isinstance(start, dict) and isinstance(start["key"]["S"], str):
            return start
    except (ValueError, KeyError, TypeError):
        pass
    raise InvalidCursor(f"not a cursor of this DynamoDB store: {cursor!r}")


def _first_token() -> int:
    """The fencing token of a key with no item (never seen, purged, deleted by TTL): this
    machine's clock in microseconds since the epoch, as ``base.first_token``; the client's
    clock, as for leases."""
    return time.time_ns() // 1000


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _get(item: dict[str, Any], name: str) -> Any:
    value = item.get(name)
    if value is None:
        return None
    if "S" in value:
        return value["S"]
    if "N" in value:
        return int(value["N"])
    if "BOOL" in value:
        return value["BOOL"]
    return None


def _record(item: dict[str, Any]) -> Record:
    created = _dt(_get(item, "created_at"))
    if created is None or _get(item, "status") not in {s.value for s in Status}:
        raise StoreError(f"DynamoDB item {_get(item, 'key')!r} is not an idemctl record")
    result = _get(item, "result")
    return Record(
        key=_get(item, "key"),
        status=Status(_get(item, "status")),
        fingerprint=_get(item, "fingerprint"),
        owner=_get(item, "owner"),
        fencing_token=_get(item, "fencing_token") or 0,
        attempts=_get(item, "attempts") or 0,
        lease_expires_at=_dt(_get(item, "lease_expires_at")),
        created_at=created,
        updated_at=_dt(_get(item, "updated_at")) or created,
        completed_at=_dt(_get(item, "completed_at")),
        expires_at=_dt(_get(item, "expires_at")),
        result=None if result is None else json.loads(result),
        error=_get(item, "error"),
        retriable=bool(_get(item, "retriable")),
    )


class DynamoDBStore(BaseStore):
    scheme = "dynamodb"

    def __init__(
        self,
        table: str,
        *,
        url: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        max_attempts: int = 3,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        self.table = table
        if concurrency < 1:
            raise ConfigError(f"store URL option concurrency={concurrency}: use 1 or more")
        self.concurrency = concurrency
        self._workers: ThreadPoolExecutor | None = None
        self._workers_lock = threading.Lock()
        # Throttling and transient errors are retried by botocore's own standard mode; every
        # request here is conditional, and a retried one is recognised (done_by, owner).
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max(10, concurrency),  # a batch's requests at once
        )
        try:
            self.client: Any = boto3.client(
                "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
            )
        except BotoCoreError as exc:
            raise ConfigError(f"DynamoDB store {self.url}: {exc}") from exc

    @classmethod
    def from_url(cls, url: str) -> DynamoDBStore:
        from idemctl.urls import UrlOptions, redact_url

        options = UrlOptions(url)
        table = options.parts.netloc or options.parts.path.strip("/")
        if not table:
            raise ConfigError(
                f"DynamoDB URL {redact_url(url)} names no table: dynamodb://TABLE?region=..."
            )
        settings: dict[str, Any] = {
            "region": options.text("region"),
            "endpoint_url": options.text("endpoint_url"),
            "lease": options.duration("lease", DEFAULT_LEASE),
            "retention": options.duration("retention", DEFAULT_RETENTION),
            "connect_timeout": options.duration("connect_timeout", 2.0),
            "read_timeout": options.duration("read_timeout", 5.0),
            "max_attempts": options.whole("max_attempts", 3, minimum=1),
            "concurrency": options.whole("concurrency", DEFAULT_CONCURRENCY, minimum=1),
        }
        options.finish()
        return cls(table, url=url, **settings)

    # Plumbing ----------------------------------------------------------------------------------

    def _call(self, operation: str, **kwargs: Any) -> Any:
        """One request; botocore's errors become idemctl's. A failed condition comes back
        as the ClientError, for the caller to read the item it carries."""
        try:
            return getattr(self.client, operation)(TableName=self.table, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ConditionalCheckFailedException":
                raise
            if code == "ResourceNotFoundException":
                raise NotProvisioned(
                    f"DynamoDB table {self.table!r} does not exist ({self.url}): run 'idemctl init'"
                ) from exc
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code, message = _error_of(exc)
            if code in _REFUSED or status == 403:
                raise ConfigError(
                    f"DynamoDB at {self.url} refused the request's credentials: {code}: {message}"
                ) from exc
            if code in _TRANSIENT:
                raise StoreUnavailable(
                    f"DynamoDB at {self.url} is throttling or failing: {exc}"
                ) from exc
            raise StoreError(f"DynamoDB at {self.url}: {exc}") from exc
        except NoCredentialsError as exc:
            raise ConfigError(f"no AWS credentials for {self.url}: {exc}") from exc
        # Refused, timed out, or hung up: nothing was decided, so fail closed.
        except (BotoConnectionError, HTTPClientError) as exc:
            raise StoreUnavailable(f"DynamoDB at {self.url} is unreachable: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"DynamoDB at {self.url}: {exc}") from exc

    def _update(
        self, key: str, update: str, condition: str, values: dict[str, Any], returns: str
    ) -> dict[str, Any]:
        """A conditional UpdateItem: the item as ``returns`` asks, or ClientError with ALL_OLD."""
        expression = update + " " + condition
        response = self._call(
            "update_item",
            Key={"key": _s(key)},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeNames=_names(expression),
            ExpressionAttributeValues=values,
            ReturnValues=returns,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return response.get("Attributes", {})  # type: ignore[no-any-return]

    def _now(self) -> int:
        return _ms(time.time())

    # The protocol ------------------------------------------------------------------------------

    def _claim_one(self, key: str, fingerprint: str | None, lease: float) -> ClaimOutcome:
        now, owner = self._now(), new_owner()
        first = _first_token()
        lease_ms = _ms(lease)
        expires = now + lease_ms
        values: dict[str, Any] = {
            ":now": _n(now), ":inprog": _s("in_progress"), ":failed": _s("failed"),
            ":true": {"BOOL": True}, ":owner": _s(owner), ":one": _n(1), ":zero": _n(0),
            ":lease": _n(expires), ":ttl": _n((expires + _ms(self.default_retention)) // 1000),
            ":tok0": _n(first - 1),
        }  # fmt: skip
        sets = (
            "SET #st = :inprog, #ow = :owner, #tok = if_not_exists(#tok, :tok0) + :one, "
            "#att = if_not_exists(#att, :zero) + :one, #lease = :lease, "
            "#cr = if_not_exists(#cr, :now), #up = :now, #ttl = :ttl"
        )
        fp_check = ""
        if fingerprint is not None:
            values[":fp"] = _s(fingerprint)
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
            record = _record(item)
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
            if record.retention_over(_dt(now) or datetime.now(UTC)):
                return self._renew(key, fingerprint, lease_ms, owner, record) or Busy(record)
            outcome, _ = decide_claim(record, key, fingerprint, _dt(now) or datetime.now(UTC), 0.0)
            return Busy(record) if isinstance(outcome, Acquired) else outcome
        old_token = _get(old, "fencing_token")
        token = first if old_token is None else old_token + 1
        attempts = (_get(old, "attempts") or 0) + 1
        takeover = _get(old, "status") == "in_progress"
        lease_at = _dt(expires)
        assert lease_at is not None
        return Acquired(key, owner, token, attempts, lease_at, takeover=takeover)

    def _renew(
        self, key: str, fingerprint: str | None, lease_ms: int, owner: str, old: Record | None
    ) -> Acquired | None:
        """A key past retention (or forgotten) starts a new life: attempts 1, the fencing
        counter going on; with no item at all, starting at the clock (``_first_token``).
        Conditional on the old item being what was read; None when somebody was faster."""
        now = self._now()
        expires = now + lease_ms
        values: dict[str, Any] = {
            ":now": _n(now), ":inprog": _s("in_progress"), ":owner": _s(owner), ":one": _n(1),
            ":lease": _n(expires), ":ttl": _n((expires + _ms(self.default_retention)) // 1000),
        }  # fmt: skip
        token = _first_token() if old is None else old.fencing_token + 1
        values[":tok"] = _n(token)
        update = (
            "SET #st = :inprog, #ow = :owner, #tok = :tok, #att = :one, #lease = :lease, "
            "#cr = :now, #up = :now, #ttl = :ttl"
        )
        if fingerprint is not None:
            values[":fp"] = _s(fingerprint)
            update += ", #fp = :fp REMOVE #exp, #done, #by, #res, #err, #retr"
        else:
            update += " REMOVE #exp, #done, #by, #res, #err, #retr, #fp"
        if old is None:
            condition = "attribute_not_exists(#k)"
        else:
            values[":oldtok"] = _n(old.fencing_token)
            condition = "#tok = :oldtok AND #exp <= :now"
        try:
            self._update(key, update, condition, values, "NONE")
        except ClientError:
            return None
        lease_at = _dt(expires)
        assert lease_at is not None
        return Acquired(key, owner, token, 1, lease_at, takeover=False)

    def _held(
        self, key: str, owner: str, fencing_token: int, update: str, values: dict[str, Any],
        retried: str | None = None,
    ) -> Record:  # fmt: skip
        """An update only the holder may make: LeaseLost otherwise. ``retried`` names the
        status a repeat of this very request would have left (botocore retries requests)."""
        values = {
            **values,
            ":owner": _s(owner),
            ":tok": _n(fencing_token),
            ":inprog": _s("in_progress"),
        }
        condition = "(#ow = :owner AND #tok = :tok AND #st = :inprog)"
        if retried:
            values[":again"] = _s(retried)
            condition += " OR (#by = :owner AND #tok = :tok AND #st = :again)"
        try:
            return _record(self._update(key, update, condition, values, "ALL_NEW"))
        except ClientError as exc:
            item = exc.response.get("Item")
            record = _record(item) if item else None
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

    def _each(self, keys: list[str], call: Callable[[int], T]) -> list[T]:
        """call(i) for every item of a batch: DynamoDB has no conditional write of many
        items that can succeed one by one, so the requests go out side by side (at most
        ``concurrency`` at once), a key's first item before any later one of the same key,
        which then sees its effect as the single forms would. Every request is waited for;
        then the first error, if any, is raised."""
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        leading = list(first.values())
        if len(leading) <= 1 or self.concurrency == 1:
            return [call(i) for i in range(len(keys))]
        with self._workers_lock:
            if self._workers is None:
                self._workers = ThreadPoolExecutor(self.concurrency, "idemctl-dynamodb")
        futures = {i: self._workers.submit(call, i) for i in leading}
        errors = [f.exception() for f in futures.values()]  # waits for every one
        if error := next((e for e in errors if e is not None), None):
            raise error
        results = {i: f.result() for i, f in futures.items()}
        return [results[i] if i in results else call(i) for i in range(len(keys))]

    def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record:
        now = self._now()
        expires = now + _ms(self._retention(retention))
        values = {
            ":now": _n(now), ":exp": _n(expires), ":ttl": _n(expires // 1000),
            ":done": _s("completed"), ":res": _s(canonical_json(result).decode()),
            ":false": {"BOOL": False},
        }  # fmt: skip
        update = (
            "SET #st = :done, #done = :now, #up = :now, #exp = :exp, #ttl = :ttl, #res = :res, "
            "#retr = :false, #by = :owner REMOVE #ow, #lease, #err"
        )
        return self._held(key, owner, fencing_token, update, values, retried="completed")

    def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record:
        now = self._now()
        expires = now + _ms(self._retention(retention))
        values = {
            ":now": _n(now), ":exp": _n(expires), ":ttl": _n(expires // 1000),
            ":failed": _s("failed"), ":err": _s(error), ":retr": {"BOOL": retriable},
        }  # fmt: skip
        update = (
            "SET #st = :failed, #up = :now, #exp = :exp, #ttl = :ttl, #err = :err, "
            "#retr = :retr, #by = :owner REMOVE #ow, #lease"
        )
        return self._held(key, owner, fencing_token, update, values, retried="failed")

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        now = self._now()
        expires = now + _ms(self._lease(lease))
        values = {
            ":now": _n(now), ":lease": _n(expires),
            ":ttl": _n((expires + _ms(self.default_retention)) // 1000),
        }  # fmt: skip
        record = self._held(
            key, owner, fencing_token, "SET #lease = :lease, #up = :now, #ttl = :ttl", values
        )
        assert record.lease_expires_at is not None
        return record.lease_expires_at

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        now = self._now()
        values = {":now": _n(now)}
        update = "SET #lease = :now, #up = :now, #by = :owner REMOVE #ow"
        if handler_ran:
            return self._held(key, owner, fencing_token, update, values, retried="in_progress")
        # Taking the attempt back is not idempotent, so a request botocore repeats after a
        # lost answer must not count as this owner's: it then reports LeaseLost, and the key
        # is released all the same.
        values[":one"] = _n(1)
        update = "SET #lease = :now, #up = :now, #by = :owner, #att = #att - :one REMOVE #ow"
        return self._held(key, owner, fencing_token, update, values)

    # Admin --------------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        item = self._call("get_item", Key={"key": _s(key)}, ConsistentRead=True).get("Item")
        if not item:
            return None
        record = _record(item)
        return None if record.retention_over(datetime.now(UTC)) else record

    def _scan(
        self, start: dict[str, Any] | None = None
    ) -> Iterator[tuple[list[Record], dict[str, Any] | None]]:
        """Every item, a page at a time, with the key to continue from (None at the end)."""
        while True:
            kwargs: dict[str, Any] = {"ConsistentRead": True}
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            start = response.get("LastEvaluatedKey")
            yield [_record(item) for item in response.get("Items", [])], start
            if not start:
                return

    def _scan_page(
        self,
        status: Status | None,
        stale_only: bool,
        prefix: str | None,
        limit: int,
        cursor: str | None,
        older_than: float,
        released_only: bool,
    ) -> Page:
        """Records in DynamoDB's scan order (not by key), at most ``limit`` a page."""
        query = replace(
            scan_query(datetime.now(UTC), status, stale_only, older_than, released_only),
            prefix=prefix,
        )
        found: list[Record] = []
        for records, after in self._scan(_start_key(cursor)):
            for i, record in enumerate(records):
                if query.matches(record):
                    found.append(record)
                    if len(found) == limit:
                        if after is None and not any(query.matches(r) for r in records[i + 1 :]):
                            return Page(found, None)  # nothing left: offer no empty page
                        # DynamoDB resumes a Scan after any item's key: go on after this one.
                        return Page(found, json.dumps({"key": _s(record.key)}))
            if after is None:
                break
        return Page(found, None)

    def stats(self) -> Stats:
        return stats_of([r for records, _ in self._scan() for r in records], datetime.now(UTC))

    def _free(self, record: Record, lease_ended_by: int | None, now: int | None = None) -> bool:
        """Take the lease from its owner, if that owner still holds it with that token and
        (``lease_ended_by``, ms) its lease ended by then; False when anything changed.
        ``now`` (ms) is the time written, by default this moment's."""
        assert record.owner is not None
        values = {
            ":now": _n(self._now() if now is None else now), ":owner": _s(record.owner),
            ":tok": _n(record.fencing_token),
        }  # fmt: skip
        condition = "#ow = :owner AND #tok = :tok"
        if lease_ended_by is not None:
            values[":cut"] = _n(lease_ended_by)
            condition += " AND #lease <= :cut"
        try:
            self._update(
                record.key, "SET #lease = :now, #up = :now REMOVE #ow", condition, values, "NONE"
            )
        except ClientError:
            return False
        return True

    def unlock(self, key: str, force: bool = False) -> Record:
        record = self.get(key)
        if record is None:
            raise KeyNotFound(key)
        now = self._now()  # one reading: the record returned is the record written
        freed = unlocked(record, datetime.fromtimestamp(now / 1000, UTC), force)
        if freed is not record and not self._free(record, None if force else now, now):
            raise StoreError(f"key {key!r} changed while it was being unlocked; try again")
        return freed

    def _batches(self, query: Query) -> Iterator[list[Record]]:
        """The records matching ``query``, at most ``ITEMS_PER_BATCH`` at a time: each is
        written by a request of its own, so a batch is only how often progress is told."""
        for records, _ in self._scan():
            matching = [r for r in records if query.matches(r)]
            for i in range(0, len(matching), ITEMS_PER_BATCH):
                yield matching[i : i + ITEMS_PER_BATCH]

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        cutoff = datetime.fromtimestamp(time.time() - older_than, UTC)
        keys: list[str] = []
        for batch in self._batches(Query(lease_expired_at=cutoff, owned=True)):
            # Each is freed by a conditional write: skipped if claimed meanwhile.
            keys += (r.key for r in batch if dry_run or self._free(r, _ms(cutoff.timestamp())))
            if batch and not dry_run and progress is not None:
                progress(len(batch))
        return sorted(keys)

    def forget(self, key: str, force: bool = False) -> Record:
        record = self.get(key)
        if record is None:
            raise KeyNotFound(key)
        check_forgettable(record, force)
        # A tombstone past retention, not a deletion: it keeps the fencing counter, and the
        # TTL deletes it a retention later. done_by goes too: a retried complete or fail of
        # the old owner must not bring the key back.
        now = self._now()
        values = {
            ":tok": _n(record.fencing_token), ":now": _n(now),
            ":ttl": _n((now + _ms(self.default_retention)) // 1000),
        }  # fmt: skip
        try:
            self._update(
                key, "SET #exp = :now, #up = :now, #ttl = :ttl REMOVE #ow, #lease, #res, #by",
                "#tok = :tok", values, "NONE",
            )  # fmt: skip
        except ClientError as exc:
            raise StoreError(
                f"key {key!r} changed while it was being forgotten; try again"
            ) from exc
        return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        cutoff = self._now() - _ms(older_than)
        purged = 0
        for batch in self._batches(Query(retention_over_at=_dt(cutoff))):
            purged += sum(1 for r in batch if dry_run or self._delete_over(r.key, cutoff))
            if batch and not dry_run and progress is not None:
                progress(len(batch))
        return purged

    def _delete_over(self, key: str, cutoff: int) -> bool:
        """Delete ``key`` if its retention ended by ``cutoff`` (ms); False if claimed again."""
        try:
            self._call(
                "delete_item", Key={"key": _s(key)}, ConditionExpression="#exp <= :cut",
                ExpressionAttributeNames={"#exp": "expires_at"},
                ExpressionAttributeValues={":cut": _n(cutoff)},
            )  # fmt: skip
        except ClientError:
            return False
        return True

    # Provisioning and health ---------------------------------------------------------------------

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(read_resource("schemas", "dynamodb.json"))
        return spec

    def _ttl_enabled(self) -> bool:
        response = self._call("describe_time_to_live")
        description = response.get("TimeToLiveDescription", {})
        return bool(
            description.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
            and description.get("AttributeName") == "ttl"
        )

    def _table_exists(self) -> bool:
        try:
            self._call("describe_table")
        except NotProvisioned:
            return False
        return True

    def provision(self, dry_run: bool = False) -> Provisioning:
        spec = self.spec()
        steps: list[str] = []
        exists = self._table_exists()
        if not exists:
            steps.append(
                f"CreateTable {json.dumps({'TableName': self.table, **spec['CreateTable']})}"
            )
            steps.append(f"wait until table {self.table} is ACTIVE")
        if not exists or not self._ttl_enabled():
            ttl = {"TableName": self.table, "TimeToLiveSpecification": spec["TimeToLive"]}
            steps.append(f"UpdateTimeToLive {json.dumps(ttl)}")
        if not steps:
            return Provisioning(
                [], changed=False, dry_run=dry_run, notes=[f"table {self.table} is ready"]
            )
        if not dry_run:
            if not exists:
                try:
                    self._call("create_table", **spec["CreateTable"])
                except StoreError as exc:
                    if "ResourceInUseException" not in str(exc.__cause__ or exc):
                        raise  # another process creating it at the same time is fine
                try:
                    self.client.get_waiter("table_exists").wait(
                        TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
                    )
                except BotoCoreError as exc:
                    raise StoreError(f"table {self.table} did not become ACTIVE: {exc}") from exc
            if not self._ttl_enabled():
                self._call("update_time_to_live", TimeToLiveSpecification=spec["TimeToLive"])
        return Provisioning(steps, changed=not dry_run, dry_run=dry_run)

    def check(self) -> list[Finding]:
        started = time.perf_counter()
        try:
            response = self._call("describe_table")
        except NotProvisioned:
            response = None
        latency = (time.perf_counter() - started) * 1000
        exists = response is not None
        findings = [
            Finding("connection", True, f"table {self.table} at {self.url}, {latency:.1f} ms"),
            Finding("table", exists, f"table {self.table} {'exists' if exists else 'is missing'}",
                    None if exists else "run 'idemctl init'"),
        ]  # fmt: skip
        if exists:
            ttl = self._ttl_enabled()
            findings.append(
                Finding("ttl", ttl, f"TTL on 'ttl' {'enabled' if ttl else 'disabled'}",
                        None if ttl else "run 'idemctl init' (else expired items stay forever)")
            )  # fmt: skip
        findings.append(self._clock_finding(response, started))
        return findings

    def _clock_finding(self, response: dict[str, Any] | None, sent: float) -> Finding:
        """Leases are judged by this machine's clock: compare it with the endpoint's HTTP
        Date header (whole seconds), which is all DynamoDB tells of its time."""
        from email.utils import parsedate_to_datetime

        headers = ((response or {}).get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
        if "date" not in headers:
            return Finding("clock", True, "the endpoint sent no Date header to compare clocks with")
        try:
            server = parsedate_to_datetime(headers["date"])
        except (TypeError, ValueError):
            return Finding("clock", True, f"cannot read the endpoint's Date {headers['date']!r}")
        midway = time.time() - (time.perf_counter() - sent) / 2
        skew = server.timestamp() - midway
        fine = abs(skew) < CLOCK_SKEW_TOLERANCE + 1  # + 1: Date has whole seconds
        return Finding(
            "clock", fine,
            f"this machine's clock is {-skew:+.1f} s from the endpoint's (Date header, 1 s "
            "resolution); leases use this machine's clock",
            None if fine else "sync this machine's clock (NTP): leases expire early or late",
        )  # fmt: skip

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        self.client.close()
