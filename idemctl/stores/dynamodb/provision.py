"""Provisioning a DynamoDB store (its table, the table's index of keys in progress, and TTL
on ``ttl``) and checking its health: the endpoint, the table, the index, TTL, and this
machine's clock, which leases are judged by. The sequence guard's entities are items of the
same table: no index or table of their own."""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import NotProvisioned, StoreError
from idemctl.model import Finding, Provisioning
from idemctl.resources import read_resource
from idemctl.stores.dynamodb.inprogress import DynamoDBInProgress
from idemctl.stores.dynamodb.items import (
    INDEX,
    INDEX_KEYS,
    SHARDS,
    n,
    names_in,
    s,
    shard_of,
    value_of,
)
from idemctl.stores.queries import CLOCK_SKEW_TOLERANCE

GUARD_NOTE = (
    "the sequence guard needs nothing more: its entities are items of this table "
    "(partition key U+001E 'entity' U+001E + name), deleted by the same TTL"
)


INDEX_WAIT = 600.0
"""Seconds ``init`` waits for DynamoDB to build the index of keys in progress on an existing
table (minutes on a large one); past it, ``init`` says so and may be run again."""

INDEX_POLL = 2.0
"""Seconds between two looks at the index's status while ``init`` waits for it."""


class DynamoDBProvisioning(DynamoDBInProgress):
    """provision() and check(): a part of DynamoDBStore."""

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
        """Make the table (with its index of keys in progress) and turn TTL on; to a table
        made before the index, add it. ``dry_run``: say what would be done, change nothing.

        Adding the index goes: mark the keys already in progress (``_mark_in_progress``),
        UpdateTable, wait until the index is ACTIVE. Marking first means that wherever this
        is stopped, running it again finishes it: no index yet, everything again (marking
        is idempotent); an index being built, only the wait. Keys this version claims are
        marked as they are claimed, index or not; a worker of an earlier version still
        running claims keys unmarked, so upgrade the workers first."""
        spec = self.spec()
        steps: list[str] = []
        notes = [GUARD_NOTE]
        exists = self._table_exists()
        if not exists:
            steps.append(
                f"CreateTable {json.dumps({'TableName': self.table, **spec['CreateTable']})}"
            )
            steps.append(f"wait until table {self.table} is ACTIVE")
        if not exists or not self._ttl_enabled():
            ttl = {"TableName": self.table, "TimeToLiveSpecification": spec["TimeToLive"]}
            steps.append(f"UpdateTimeToLive {json.dumps(ttl)}")
        index = self._index() if exists else None
        status = None if index is None else str(index.get("IndexStatus", "ACTIVE"))
        add_index = exists and index is None
        wait_index = exists and status != "ACTIVE"
        if status == "DELETING":
            raise StoreError(
                f"index {INDEX} of table {self.table} is being deleted: run 'idemctl init' "
                "again once it is gone, to make it anew"
            )
        if add_index:
            steps.append(
                "Scan for keys in progress without ip_shard, and set it on each "
                "(an UpdateItem conditional on the key being in progress with the same "
                "fencing token)"
            )
            steps.append(f"UpdateTable {json.dumps(self._index_update(spec))}")
        if wait_index:
            steps.append(f"wait until index {INDEX} is ACTIVE (at most {INDEX_WAIT:.0f} s)")
        if index is not None and index.get("KeySchema") != INDEX_KEYS:
            notes.append(_foreign_index(index))
        if not steps:
            return Provisioning(
                [], changed=False, dry_run=dry_run, notes=[f"table {self.table} is ready", *notes]
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
            if add_index:
                marked = self._mark_in_progress()
                self._add_index(spec)
                steps.append(f"marked {marked} key(s) in progress")
            if wait_index:
                self._wait_for_index()
            self._index_active = None  # asked again at the next read
        return Provisioning(steps, changed=not dry_run, dry_run=dry_run, notes=notes)

    def _index_update(self, spec: dict[str, Any]) -> dict[str, Any]:
        """UpdateTable's arguments that add the index to a table made before it: the
        index as CreateTable makes it, with the definitions of its key attributes."""
        create = spec["CreateTable"]
        (index,) = [i for i in create["GlobalSecondaryIndexes"] if i["IndexName"] == INDEX]
        keys = {k["AttributeName"] for k in index["KeySchema"]}
        return {
            "AttributeDefinitions": [
                a for a in create["AttributeDefinitions"] if a["AttributeName"] in keys
            ],
            "GlobalSecondaryIndexUpdates": [{"Create": index}],
        }

    def _add_index(self, spec: dict[str, Any]) -> None:
        """UpdateTable: create the index. Another ``init`` may have done so meanwhile."""
        try:
            self._call("update_table", **self._index_update(spec))
        except StoreError:
            if self._index() is None:
                raise

    def _wait_for_index(self) -> None:
        """Until the index is ACTIVE, at most INDEX_WAIT seconds: StoreError otherwise."""
        deadline = time.monotonic() + INDEX_WAIT
        while (status := self.index_status()) != "ACTIVE":
            if status is None or status == "DELETING":
                raise StoreError(
                    f"index {INDEX} of table {self.table} is "
                    f"{'gone' if status is None else 'being deleted'} while 'idemctl init' "
                    "waited for it: run 'idemctl init' again"
                )
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"index {INDEX} of table {self.table} is still {status} after "
                    f"{INDEX_WAIT:.0f} s (DynamoDB builds it from every item): run "
                    "'idemctl init' again to wait on; until it is ACTIVE, list --stale, "
                    "unlock --stale and stats scan the table"
                )
            time.sleep(INDEX_POLL)

    def _mark_in_progress(self) -> int:
        """Set ip_shard on the live keys in progress that lack it (claimed by a version
        before the index), each by an UpdateItem conditional on the key being in progress,
        live, with the fencing token the scan read: a key claimed, completed or forgotten
        since is left to its own writes. How many were marked. One Scan of the table,
        once: ``provision`` runs it only while the table has no index."""
        live = "(attribute_not_exists(#exp) OR #exp > :now)"
        unmarked = f"#st = :inprog AND attribute_not_exists(#ips) AND {live}"
        projection = "#k, #tok"
        marked, start = 0, None
        while True:
            kwargs: dict[str, Any] = {
                "FilterExpression": unmarked,
                "ProjectionExpression": projection,
                "ExpressionAttributeNames": names_in(unmarked + projection),
                "ExpressionAttributeValues": {":inprog": s("in_progress"), ":now": n(self._now())},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            for item in response.get("Items", []):
                key, token = value_of(item, "key"), item.get("fencing_token")
                if token is None:
                    continue  # not a record idemctl wrote
                values = {
                    ":inprog": s("in_progress"),
                    ":ips": shard_of(key),
                    ":tok": token,
                    ":now": n(self._now()),
                }
                condition = f"#st = :inprog AND #tok = :tok AND {live}"
                try:
                    self._update(key, "SET #ips = :ips", condition, values, "NONE")
                except ClientError:
                    continue  # changed since the scan read it: its own write set or removed it
                marked += 1
            start = response.get("LastEvaluatedKey")
            if not start:
                return marked

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
            Finding(
                "table",
                exists,
                f"table {self.table} {'exists' if exists else 'is missing'}",
                None if exists else "run 'idemctl init'",
            ),
        ]
        if exists:
            assert response is not None
            findings.append(self._index_finding(response["Table"]))
            ttl = self._ttl_enabled()
            findings.append(
                Finding(
                    "ttl",
                    ttl,
                    f"TTL on 'ttl' {'enabled' if ttl else 'disabled'}",
                    None if ttl else "run 'idemctl init' (else expired items stay forever)",
                )
            )
        findings.append(self._clock_finding(response, started))
        return findings

    def _index_finding(self, table: dict[str, Any]) -> Finding:
        """Whether the index of keys in progress is there and ACTIVE: a warning, not a
        failure, when it is not, since the commands that read it scan the table instead."""
        index = self._index(table)
        scans = "until then list --stale, unlock --stale and stats scan the whole table"
        if index is None:
            return Finding(
                "index",
                True,
                f"index {INDEX} of keys in progress is missing (a table made before it)",
                f"run 'idemctl init' (it adds the index and marks the keys in progress): {scans}",
                warning=True,
            )
        status = str(index.get("IndexStatus", "ACTIVE"))
        if index.get("KeySchema") != INDEX_KEYS:
            return Finding("index", True, _foreign_index(index), None, warning=True)
        if status != "ACTIVE":
            return Finding(
                "index",
                True,
                f"index {INDEX} of keys in progress is {status}",
                f"wait, or run 'idemctl init', which waits until it is ACTIVE: {scans}",
                warning=True,
            )
        return Finding(
            "index",
            True,
            f"index {INDEX} of keys in progress is ACTIVE ({SHARDS} shards of ip_shard, "
            "by lease_expires_at)",
        )

    def _clock_finding(self, response: dict[str, Any] | None, sent: float) -> Finding:
        """Leases are judged by this machine's clock: compare it with the endpoint's HTTP
        Date header (whole seconds), which is all DynamoDB tells of its time."""
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
            "clock",
            fine,
            f"this machine's clock is {-skew:+.1f} s from the endpoint's (Date header, 1 s "
            "resolution); leases use this machine's clock",
            None if fine else "sync this machine's clock (NTP): leases expire early or late",
        )


def _foreign_index(index: dict[str, Any]) -> str:
    """What to say of an index of the name idemctl's has, with other keys."""
    keys = ", ".join(f"{k['AttributeName']} {k['KeyType']}" for k in index.get("KeySchema", []))
    return (
        f"index {INDEX} has other keys ({keys}) than idemctl's (ip_shard HASH, "
        "lease_expires_at RANGE): list --stale, unlock --stale and stats scan the table; "
        f"delete that index and run 'idemctl init' to make idemctl's"
    )
