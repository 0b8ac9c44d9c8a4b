"""Provisioning a DynamoDB store (its table, and TTL on ``ttl``) and checking its health:
the endpoint, the table, TTL, and this machine's clock, which leases are judged by. The
sequence guard's entities are items of the same table: no index or table of their own."""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import NotProvisioned, StoreError
from idemctl.model import Finding, Provisioning
from idemctl.resources import read_resource
from idemctl.stores.base import CLOCK_SKEW_TOLERANCE
from idemctl.stores.dynamodb.inprogress import DynamoDBInProgress
from idemctl.stores.dynamodb.items import INDEX, names_in, s, shard_of, value_of

GUARD_NOTE = (
    "the sequence guard needs nothing more: its entities are items of this table "
    "(partition key U+001E 'entity' U+001E + name), deleted by the same TTL"
)


INDEX_WAIT = 600.0
"""Seconds ``init`` waits for DynamoDB to build the in-progress index on an existing table."""


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
        add_index = exists and self.index_status() is None
        if add_index:
            steps.append(f"UpdateTable {json.dumps(self._index_update(spec))}")
            steps.append(f"wait until index {INDEX} is ACTIVE")
            steps.append(
                "Scan for keys in progress without ip_shard, and set it on each "
                "(conditional on the item unchanged)"
            )
        if not steps:
            return Provisioning(
                [],
                changed=False,
                dry_run=dry_run,
                notes=[f"table {self.table} is ready", GUARD_NOTE],
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
                self._call("update_table", **self._index_update(spec))
                self._wait_for_index()
                marked = self._mark_in_progress()
                steps.append(f"marked {marked} key(s) in progress")
            self._index_active = None  # asked again at the next read
        return Provisioning(steps, changed=not dry_run, dry_run=dry_run, notes=[GUARD_NOTE])

    def _index_update(self, spec: dict[str, Any]) -> dict[str, Any]:
        """UpdateTable's arguments that add the in-progress index to a table made before it."""
        create = spec["CreateTable"]
        return {
            "AttributeDefinitions": [
                a for a in create["AttributeDefinitions"] if a["AttributeName"] != "key"
            ],
            "GlobalSecondaryIndexUpdates": [{"Create": create["GlobalSecondaryIndexes"][0]}],
        }

    def _wait_for_index(self) -> None:
        deadline = time.monotonic() + INDEX_WAIT
        while (status := self.index_status()) != "ACTIVE":
            if time.monotonic() > deadline:
                raise StoreError(
                    f"index {INDEX} of table {self.table} is still {status} after "
                    f"{INDEX_WAIT:.0f} s: run 'idemctl init' again once DynamoDB has built it"
                )
            time.sleep(2)

    def _mark_in_progress(self) -> int:
        """Set ip_shard on the keys in progress that lack it (written before the index),
        each by a write conditional on the item being what the scan read; how many."""
        condition = "#st = :inprog AND attribute_not_exists(#ips)"
        marked, start = 0, None
        while True:
            kwargs: dict[str, Any] = {
                "FilterExpression": condition,
                "ExpressionAttributeNames": names_in(condition),
                "ExpressionAttributeValues": {":inprog": s("in_progress")},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            for item in response.get("Items", []):
                key = value_of(item, "key")
                values = {
                    ":inprog": s("in_progress"),
                    ":ips": shard_of(key),
                    ":tok": item["fencing_token"],
                }
                try:
                    self._update(
                        key, "SET #ips = :ips", "#st = :inprog AND #tok = :tok", values, "NONE"
                    )
                    marked += 1
                except ClientError:
                    pass  # changed since the scan read it: its own write set or removed it
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
            status = self.index_status()
            findings.append(
                Finding(  # a warning: the commands still work, scanning the table
                    "index",
                    True,
                    f"index {INDEX} of keys in progress is {status or 'missing'}",
                    None
                    if status == "ACTIVE"
                    else "run 'idemctl init': until then list --stale, unlock --stale and "
                    "stats scan the whole table",
                    warning=status != "ACTIVE",
                )
            )
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
