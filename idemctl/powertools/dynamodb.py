"""A Powertools idempotency table on DynamoDB (``DynamoDBPersistenceLayer``'s layout).

On a table with a sort key, Powertools keeps every record of a function under one partition
(``static_pk_value``, ``idempotency#<FUNCTION>`` by default): listing is then a Query of that
partition. A single-key table, or a sort-key table with no ``static_pk_value`` given, is
read by a Scan. Deletes are conditional DeleteItems whose failed condition returns the item
(``ReturnValuesOnConditionCheckFailure``)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import ConfigError, NotProvisioned
from idemctl.model import Finding
from idemctl.powertools.model import (
    COMPLETED,
    INPROGRESS,
    Layout,
    PowertoolsRecord,
    in_ms,
    record_from,
)
from idemctl.powertools.table import Delete, PowertoolsTable, Rule, records_findings
from idemctl.stores.dynamodb.client import condition_failed, make_client, translate
from idemctl.urls import UrlOptions, redact_url


class DynamoDBPowertoolsTable(PowertoolsTable):
    def __init__(self, table: str, layout: Layout, client: Any, url: str) -> None:
        self.table = table
        self.layout = layout
        self.client = client
        self.url = redact_url(url)
        self._plain = TypeDeserializer()

    @classmethod
    def from_url(cls, url: str, options: UrlOptions, layout: Layout) -> DynamoDBPowertoolsTable:
        from idemctl.stores.dynamodb.store import TABLE_NAME

        table = options.parts.netloc or options.parts.path.strip("/")
        if not TABLE_NAME.fullmatch(table):
            raise ConfigError(
                f"DynamoDB URL {redact_url(url)} names no table: dynamodb://TABLE?..."
            )
        client = make_client(
            redact_url(url),
            region=options.text("region"),
            endpoint_url=options.text("endpoint_url"),
            connect_timeout=options.duration("connect_timeout", 2.0, 0.001),
            read_timeout=options.duration("read_timeout", 5.0, 0.001),
            max_attempts=options.whole("max_attempts", 3, minimum=1),
            max_pool_connections=4,
        )
        options.finish()
        return cls(table, layout, client, url)

    # Requests ------------------------------------------------------------------------------

    def _call(self, operation: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, operation)(TableName=self.table, **kwargs)
        except ClientError as exc:
            if condition_failed(exc):
                raise
            error = translate(exc, self.table, self.url)
            if isinstance(error, NotProvisioned):
                raise NotProvisioned(
                    f"DynamoDB table {self.table!r} does not exist ({self.url}): check the "
                    "name (idemctl never creates Powertools' tables)"
                ) from exc
            raise error from exc
        except BotoCoreError as exc:
            raise translate(exc, self.table, self.url) from exc

    def _key(self, key: str, partition: str | None = None) -> dict[str, Any]:
        """The primary key of ``key``'s item, as Powertools' ``_get_key`` builds it (in
        ``partition`` where given)."""
        lay = self.layout
        if lay.sort_key_attr is None:
            return {lay.key_attr: {"S": key}}
        partition = partition or lay.static_pk_value
        if partition is None:
            raise ConfigError(
                f"{self.url}: a table with a sort key needs static_pk_value (the partition "
                "Powertools keeps the function's records under, e.g. "
                "static_pk_value=idempotency%23my-function) to find one key"
            )
        return {lay.key_attr: {"S": partition}, lay.sort_key_attr: {"S": key}}

    def _record(self, item: dict[str, Any]) -> PowertoolsRecord:
        """The record of an item: one whose ``problems`` say why where the item is no
        Powertools record."""
        values = {k: _plain(self._plain.deserialize(v)) for k, v in item.items()}
        lay = self.layout
        if lay.sort_key_attr is None:
            return record_from(str(values.get(lay.key_attr)), values, lay, with_key=True)
        return record_from(
            str(values.get(lay.sort_key_attr)),
            values,
            lay,
            str(values.get(lay.key_attr)),
            with_key=True,
        )

    # The backend's part --------------------------------------------------------------------

    def _read(self, key: str) -> PowertoolsRecord | None:
        item = self._call("get_item", Key=self._key(key), ConsistentRead=True).get("Item")
        return self._record(item) if item else None

    def _items(
        self, prefix: str | None, limit: int | None = None
    ) -> Iterator[list[PowertoolsRecord]]:
        lay = self.layout
        kwargs: dict[str, Any] = {"ConsistentRead": True}
        if limit is not None:
            kwargs["Limit"] = limit
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        by_query = lay.sort_key_attr is not None and lay.static_pk_value is not None
        if by_query:
            names["#pk"] = lay.key_attr
            values[":pk"] = {"S": lay.static_pk_value}
            condition = "#pk = :pk"
            if prefix:
                names["#sk"], values[":pfx"] = str(lay.sort_key_attr), {"S": prefix}
                condition += " AND begins_with(#sk, :pfx)"
            kwargs["KeyConditionExpression"] = condition
        elif prefix:
            names["#k"] = lay.sort_key_attr or lay.key_attr
            values[":pfx"] = {"S": prefix}
            kwargs["FilterExpression"] = "begins_with(#k, :pfx)"
        if names:
            kwargs["ExpressionAttributeNames"] = names
            kwargs["ExpressionAttributeValues"] = values
        start: dict[str, Any] | None = None
        while True:
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("query" if by_query else "scan", **kwargs)
            yield [self._record(item) for item in response.get("Items", [])]
            start = response.get("LastEvaluatedKey")
            if not start or limit is not None:
                return

    def _shape(self) -> str | None:
        try:
            described = self._call("describe_table")["Table"]
        except ConfigError:  # no DescribeTable allowed: the sample of items judges alone
            return None
        schema = self._schema(described)
        want = self._wanted_schema()
        if schema == want:
            return None
        return (
            f"the table's key is {_shown(schema)}, not Powertools' {_shown(want)} as the URL's "
            "layout says (key_attr, sort_key_attr): another application's table, or the URL "
            "lacks the persistence layer's key names"
        )

    def _schema(self, described: dict[str, Any]) -> dict[str, str]:
        return {k["KeyType"]: k["AttributeName"] for k in described["KeySchema"]}

    def _wanted_schema(self) -> dict[str, str]:
        lay = self.layout
        return {"HASH": lay.key_attr, **({"RANGE": lay.sort_key_attr} if lay.sort_key_attr else {})}

    def _delete(self, d: Delete) -> tuple[bool, PowertoolsRecord | None]:
        lay = self.layout
        # Every rule deletes Powertools records only: a status it writes, a numeric expiry.
        names: dict[str, str] = {"#st": lay.status_attr, "#exp": lay.expiry_attr}
        values: dict[str, Any] = {
            ":inprog": {"S": INPROGRESS},
            ":done": {"S": COMPLETED},
            ":num": {"S": "N"},
        }
        condition = "#st IN (:inprog, :done) AND attribute_type(#exp, :num)"
        if d.rule in (Rule.UNLOCK, Rule.UNLOCK_FORCE):
            condition += " AND #st = :inprog"
            if d.rule is Rule.UNLOCK:
                names["#ipe"] = lay.in_progress_expiry_attr
                values[":cut"] = {"N": str(in_ms(d.cutoff))}
                values[":now"] = {"N": str(int(d.now.timestamp()))}
                condition += " AND ((attribute_exists(#ipe) AND #ipe < :cut) OR #exp < :now)"
        elif d.rule is Rule.FORGET:
            values[":now"] = {"N": str(int(d.now.timestamp()))}
            condition += " AND (#st = :done OR #exp < :now)"
        elif d.rule is Rule.PURGE:
            values[":cut"] = {"N": str(int(d.cutoff.timestamp()))}
            condition += " AND #exp < :cut"
        try:
            response = self._call(
                "delete_item",
                Key=self._key(d.key, d.partition),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            item = exc.response.get("Item")
            return False, self._record(item) if item else None
        return True, self._record(response.get("Attributes") or {})

    def check(self) -> list[Finding]:
        lay = self.layout
        schema = self._schema(self._call("describe_table")["Table"])
        want = self._wanted_schema()
        findings = [self._schema_finding(schema, want)]
        ttl = self._call("describe_time_to_live").get("TimeToLiveDescription", {})
        on = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        if on and ttl.get("AttributeName") == lay.expiry_attr:
            findings.append(Finding("ttl", True, f"TTL on {lay.expiry_attr!r}"))
        else:
            now_on = f"on {ttl.get('AttributeName')!r}" if on else "off"
            findings.append(
                Finding(
                    "ttl",
                    True,
                    f"TTL is {now_on}: expired records stay (Powertools treats them as absent) "
                    "and the table only grows",
                    f"aws dynamodb update-time-to-live --table-name {self.table} "
                    f"--time-to-live-specification Enabled=true,AttributeName={lay.expiry_attr}",
                    warning=True,
                ),
            )
        if schema == want:
            findings += records_findings(self)
        return findings

    def _schema_finding(self, schema: dict[str, str], want: dict[str, str]) -> Finding:
        if schema == want:
            return Finding("key schema", True, f"{_shown(schema)}, as the URL says")
        return Finding(
            "key schema",
            False,
            f"the table's key is {_shown(schema)}; the URL's layout expects {_shown(want)}",
            "give the URL Powertools' key_attr and sort_key_attr (as its "
            "DynamoDBPersistenceLayer was built)",
        )


def _shown(schema: dict[str, str]) -> str:
    return ", ".join(f"{t.lower()} {n!r}" for t, n in sorted(schema.items()))


def _plain(value: Any) -> Any:
    """A deserialized attribute with Decimals as int or float, sets as lists."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return value
