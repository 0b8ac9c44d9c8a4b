"""Powertools idempotency tables for idemctl to read: DynamoDB tables on the session's moto
server (one per test, created here as Powertools' docs create them: idemctl never creates
them) and a Redis database of the worker's redis-server, flushed for each test.

``PtTable`` is one such table: ``url`` idemctl's URL for it (``layout=powertools`` and
Powertools' own constructor arguments), ``job(payload)`` a writer job on it
(tests/powertools/writers.py), ``raw(key)`` the stored attributes, read past idemctl."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from idemctl.powertools import open_table
from idemctl.powertools.table import PowertoolsTable
from tests.backends import unique_table
from tests.powertools.writers import LAMBDA_ENV, Job, Store, runs
from tests.servers import MotoServer, RedisServer

DB = 9
"""The Redis database these tests use (the others use 0): flushed before and after each."""

LAYOUTS: dict[str, dict[str, str]] = {
    "single": {},
    "sort": {"sort_key_attr": "sk", "static_pk_value": "idempotency#orders"},
    "renamed": {
        "key_attr": "pk",
        "expiry_attr": "exp_at",
        "status_attr": "st",
        "in_progress_expiry_attr": "ipe",
        "data_attr": "payload",
        "validation_key_attr": "vh",
    },
}
"""DynamoDBPersistenceLayer's arguments: the defaults (key ``id``); a sort key with a static
partition value; every attribute renamed."""

JOB_DEFAULTS: dict[str, dict[str, Any]] = {
    "renamed": {"payload_validation_jmespath": "amount"},  # so the validation hash is written
}


@dataclass
class PtTable:
    name: str
    url: str
    store: Store
    dir: Path
    read: Callable[[str], dict[str, Any] | None]
    write: Callable[[str, dict[str, Any]], None]
    """Put a record's attributes back as they are given (past idemctl and Powertools)."""
    delete: Callable[[str], None]
    job_defaults: dict[str, Any] = field(default_factory=dict)
    opened: list[PowertoolsTable] = field(default_factory=list)

    @property
    def layer(self) -> dict[str, Any]:
        return self.store.layer

    def attr(self, name: str) -> str:
        """The attribute Powertools keeps ``name`` (expiry_attr, status_attr, ...) under."""
        defaults = {
            "key_attr": "id",
            "expiry_attr": "expiration",
            "in_progress_expiry_attr": "in_progress_expiration",
            "status_attr": "status",
            "data_attr": "data",
            "validation_key_attr": "validation",
        }
        return str(self.layer.get(name, defaults[name]))

    def runs_file(self, payload: Any) -> Path:
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        return self.dir / f"runs-{digest[:16]}"

    def job(self, payload: Any, **options: Any) -> Job:
        """A writer job for ``payload`` on this table; its runs counted per payload."""
        options = {**self.job_defaults, **options}
        options.setdefault("runs_file", str(self.runs_file(payload)))
        return Job(self.store, payload, **options)

    def runs(self, payload: Any) -> int:
        return runs(self.runs_file(payload))

    def raw(self, key: str) -> dict[str, Any] | None:
        return self.read(key)

    def backdate(self, key: str, **attributes: Any) -> None:
        """Set some of the record's attributes (its expirations): the record's timestamps
        moved into the past instead of a test waiting for the wall clock to pass them."""
        doc = self.read(key)
        assert doc is not None, key
        self.write(key, {**doc, **attributes})

    def open(self, url: str | None = None) -> PowertoolsTable:
        table = open_table(url or self.url)
        self.opened.append(table)
        return table

    def close(self) -> None:
        for table in self.opened:
            table.close()


@pytest.fixture(autouse=True)
def _no_lambda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Powertools reads AWS_LAMBDA_FUNCTION_NAME into every key: unset, as outside Lambda."""
    for name in LAMBDA_ENV:
        monkeypatch.delenv(name, raising=False)


# DynamoDB ------------------------------------------------------------------------------------


def create_table(server: MotoServer, name: str, layer: dict[str, Any]) -> None:
    """The table as Powertools' docs create it: a string partition key (and sort key)."""
    key_attr = layer.get("key_attr", "id")
    schema = [{"AttributeName": key_attr, "KeyType": "HASH"}]
    attributes = [{"AttributeName": key_attr, "AttributeType": "S"}]
    if layer.get("sort_key_attr"):
        schema.append({"AttributeName": layer["sort_key_attr"], "KeyType": "RANGE"})
        attributes.append({"AttributeName": layer["sort_key_attr"], "AttributeType": "S"})
    server.client().create_table(
        TableName=name,
        KeySchema=schema,
        AttributeDefinitions=attributes,
        BillingMode="PAY_PER_REQUEST",
    )


def enable_ttl(server: MotoServer, table: PtTable) -> None:
    server.client().update_time_to_live(
        TableName=table.store.table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": table.attr("expiry_attr")},
    )


def dynamodb_table(server: MotoServer, tmp_path: Path, name: str, layer: dict[str, Any]) -> PtTable:
    """A new Powertools table with ``layer``'s arguments on the moto server."""
    from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

    table = unique_table()
    create_table(server, table, layer)
    client = server.client()
    key_attr = layer.get("key_attr", "id")

    def read(key: str) -> dict[str, Any] | None:
        if layer.get("sort_key_attr"):
            item_key = {
                key_attr: {"S": layer["static_pk_value"]},
                layer["sort_key_attr"]: {"S": key},
            }
        else:
            item_key = {key_attr: {"S": key}}
        item = client.get_item(TableName=table, Key=item_key, ConsistentRead=True).get("Item")
        if item is None:
            return None
        plain = TypeDeserializer().deserialize({"M": item})
        assert isinstance(plain, dict)
        return plain

    def write(key: str, doc: dict[str, Any]) -> None:
        client.put_item(TableName=table, Item=TypeSerializer().serialize(doc)["M"])

    def delete(key: str) -> None:
        raise AssertionError("DynamoDB's TTL deletes nothing at once: nothing to stand for")

    store = Store("dynamodb", table=table, endpoint_url=server.endpoint_url, layer=layer)
    return PtTable(
        name,
        server.url(table, layout="powertools", **layer),
        store,
        tmp_path,
        read,
        write,
        delete,
        JOB_DEFAULTS.get(name, {}),
    )


@pytest.fixture(params=sorted(LAYOUTS))
def dynamo(
    request: pytest.FixtureRequest, moto_server: MotoServer, tmp_path: Path
) -> Iterator[PtTable]:
    """A Powertools table on DynamoDB in each layout (single, sort, renamed)."""
    table = dynamodb_table(moto_server, tmp_path, request.param, LAYOUTS[request.param])
    try:
        yield table
    finally:
        table.close()


@pytest.fixture
def single(moto_server: MotoServer, tmp_path: Path) -> Iterator[PtTable]:
    """A Powertools table on DynamoDB with Powertools' defaults (key ``id``)."""
    table = dynamodb_table(moto_server, tmp_path, "single", LAYOUTS["single"])
    try:
        yield table
    finally:
        table.close()


# Redis -----------------------------------------------------------------------------------------


@pytest.fixture
def redis_pt(redis_server: RedisServer, tmp_path: Path) -> Iterator[PtTable]:
    """Powertools' Redis layer on database DB of the worker's redis-server, empty."""
    client = redis_server.client(db=DB, decode_responses=True)
    client.flushdb()

    def read(key: str) -> dict[str, Any] | None:
        raw = client.get(key)
        if raw is None:
            return None
        doc = json.loads(raw)
        assert isinstance(doc, dict)
        return doc

    def write(key: str, doc: dict[str, Any]) -> None:
        client.set(key, json.dumps(doc), keepttl=True)

    store = Store("redis", port=redis_server.port, db=DB)
    url = redis_server.url(f"/{DB}", "layout=powertools")
    table = PtTable("redis", url, store, tmp_path, read, write, client.delete)
    try:
        yield table
    finally:
        table.close()
        client.flushdb()
        client.close()


@pytest.fixture
def redis_client(redis_server: RedisServer, redis_pt: PtTable) -> Iterator[Any]:
    """A client on ``redis_pt``'s database."""
    client = redis_server.client(db=DB, decode_responses=True)
    try:
        yield client
    finally:
        client.close()
