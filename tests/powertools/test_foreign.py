"""Another application's data behind a ``layout=powertools`` URL: a DynamoDB table keyed
``id`` (or ``pk``) and a Redis database of plain JSON values, some with a ``status`` and a
past ``expiration`` of their own. Every command that writes keeps every item, and says
why; a mixed database loses only the Powertools records a sweep is for."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from idemctl.cli.exitcodes import ExitCode
from idemctl.powertools.table import Delete, Rule
from tests.backends import unique_table
from tests.cli.helpers import json_doc, on
from tests.powertools.conftest import PtTable
from tests.powertools.writers import call, key_of
from tests.servers import MotoServer

PAST = int(time.time()) - 3600
"""An ``expiration`` an hour gone: what purge and forget look for."""

SESSIONS: dict[str, dict[str, Any]] = {
    "s-1": {"status": "ACTIVE", "expiration": PAST, "user": "ann"},
    "s-2": {"status": "CLOSED", "expiration": PAST, "user": "bob"},
    "s-3": {"status": "ACTIVE", "expiration": PAST + 7200},
    "s-4": {"status": "CLOSED", "expiration": PAST},
}
"""A session table's items: their own statuses, a past expiration on most."""

LOOK_ALIKES: dict[str, dict[str, Any]] = {
    "job-1": {"status": "COMPLETED", "expiration": PAST, "owner": "billing"},
    "job-3": {"status": "COMPLETED", "expiration": str(PAST)},
}
"""Items with a status Powertools writes that are still not its records: an attribute it
never writes; an expiration that is no number."""

WRITES = [
    ["purge", "--yes"],
    ["unlock", "--stale", "--yes"],
    ["forget", "s-2"],
    ["forget", "s-2", "--force"],
    ["unlock", "s-1", "--force"],
]
READS = [["stats"], ["list"], ["inspect", "s-1"]]


@dataclass
class Foreign:
    url: str
    keys: Callable[[], dict[str, dict[str, Any]]]
    """Every item now, by key, as stored."""


def dynamodb_items(server: MotoServer, table: str, key_attr: str) -> dict[str, dict[str, Any]]:
    from boto3.dynamodb.types import TypeDeserializer

    items = server.client().scan(TableName=table, ConsistentRead=True)["Items"]
    plain = [TypeDeserializer().deserialize({"M": item}) for item in items]
    return {str(item[key_attr]): item for item in plain}


def foreign_dynamodb(server: MotoServer, key_attr: str) -> Foreign:
    from boto3.dynamodb.types import TypeSerializer

    table = unique_table()
    client = server.client()
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": key_attr, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key_attr, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    typed = TypeSerializer()
    for key, values in SESSIONS.items():
        item = {key_attr: key, **values}
        client.put_item(TableName=table, Item={k: typed.serialize(v) for k, v in item.items()})
    return Foreign(
        server.url(table, layout="powertools"), lambda: dynamodb_items(server, table, key_attr)
    )


@pytest.fixture(params=["dynamodb-id", "dynamodb-pk", "redis"])
def foreign(request: pytest.FixtureRequest) -> Iterator[Foreign]:
    if request.param == "redis":
        pt: PtTable = request.getfixturevalue("redis_pt")
        client = request.getfixturevalue("redis_client")
        for key, values in SESSIONS.items():
            client.set(key, json.dumps(values))

        def stored() -> dict[str, dict[str, Any]]:
            return {k: json.loads(client.get(k)) for k in client.scan_iter()}

        yield Foreign(pt.url, stored)
        return
    key_attr = request.param.removeprefix("dynamodb-")
    yield foreign_dynamodb(request.getfixturevalue("moto_server"), key_attr)


@pytest.mark.parametrize("args", WRITES + READS, ids=" ".join)
def test_a_foreign_table_is_refused_and_keeps_every_item(foreign: Foreign, args: list[str]) -> None:
    before = foreign.keys()
    assert set(before) == set(SESSIONS)
    result = on(foreign.url, *args)
    assert result.exit_code == ExitCode.NOT_PROVISIONED, (result.stdout, result.stderr)
    assert foreign.keys() == before
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    if "pk" in lines[0] and "key is" in lines[0]:
        assert "hash 'pk'" in lines[0] and "hash 'id'" in lines[0]
    else:
        assert "none of the 4 item(s) read is a Powertools record" in lines[0]
        assert "is neither INPROGRESS nor COMPLETED" in lines[0]
    assert "nothing" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_dynamodb_table_keyed_otherwise_names_both_keys(moto_server: MotoServer) -> None:
    table = foreign_dynamodb(moto_server, "pk")
    result = on(table.url, "purge", "--yes")
    assert result.exit_code == ExitCode.NOT_PROVISIONED
    assert "the table's key is hash 'pk', not Powertools' hash 'id'" in result.stderr
    assert "ValidationException" not in result.stderr


def test_doctor_says_the_table_is_not_powertools(foreign: Foreign) -> None:
    result = on(foreign.url, "doctor", "--json")
    assert result.exit_code == 1, result.stderr
    doc = json.loads(result.stdout)
    failed = [f for f in doc["findings"] if not f["ok"]]
    assert failed, doc
    assert any(
        "none of the 4 item(s) is a Powertools record" in c["detail"]
        or "the table's key is" in c["detail"]
        for c in failed
    ), failed


# A database shared with another application ---------------------------------------------


@pytest.fixture(params=["single", "redis"])
def mixed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[PtTable, Any]]:
    """A Powertools table with Powertools' own records, expired and live, beside
    LOOK_ALIKES and SESSIONS; yields it and a writer of raw items (key, values)."""
    if request.param == "redis":
        pt: PtTable = request.getfixturevalue("redis_pt")
        client = request.getfixturevalue("redis_client")
        yield pt, lambda key, values: client.set(key, json.dumps(values))
        return
    from boto3.dynamodb.types import TypeSerializer

    from tests.powertools.conftest import dynamodb_table

    server = request.getfixturevalue("moto_server")
    pt = dynamodb_table(server, tmp_path, "single", {})
    typed = TypeSerializer()

    def put(key: str, values: dict[str, Any]) -> None:
        item = {"id": key, **values}
        server.client().put_item(
            TableName=pt.store.table, Item={k: typed.serialize(v) for k, v in item.items()}
        )

    try:
        yield pt, put
    finally:
        pt.close()


def test_a_mixed_table_loses_only_powertools_records(mixed: tuple[PtTable, Any]) -> None:
    pt, put = mixed
    job = pt.job({"order_id": "o-1"})
    assert call(job).kind == "ran"
    live = key_of(job)
    expired = "orders.pay#expired"
    put(expired, {"status": "COMPLETED", "expiration": PAST, "data": '"done"'})
    stale = "orders.pay#stale"
    put(stale, {"status": "INPROGRESS", "expiration": PAST + 7200, "in_progress_expiration": 1})
    others = {**SESSIONS, **LOOK_ALIKES}
    for key, values in others.items():
        put(key, values)

    result = on(pt.url, "purge", "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, "action.schema.json")
    assert (doc["count"], doc["skipped"]) == (1, len(others))
    assert pt.raw(expired) is None

    text = on(pt.url, "unlock", "--stale", "--yes")
    assert text.exit_code == 0, text.stderr
    assert f"{len(others)} other item(s) are no Powertools records: left alone" in text.stderr
    assert pt.raw(stale) is None

    for key in others:
        for args in (["forget", key, "--force"], ["unlock", key, "--force"]):
            refused = on(pt.url, *args)
            assert refused.exit_code == ExitCode.REFUSED, (args, refused.stderr)
            assert "is not a Powertools record" in refused.stderr
    assert all(pt.raw(key) is not None for key in others)
    assert pt.raw(live) is not None

    stats = json.loads(on(pt.url, "stats", "--json").stdout)
    assert (stats["total"], stats["skipped"]) == (1, len(others))
    listed = on(pt.url, "list")
    assert listed.exit_code == 0
    assert f"{len(others)} other item(s) are no Powertools records: not listed" in listed.stderr
    inspected = json.loads(on(pt.url, "inspect", "job-1", "--json").stdout)
    assert inspected["state"] == "invalid"
    assert inspected["problems"] == ["attributes Powertools never writes: 'owner'"]


def test_the_store_itself_refuses_to_delete_a_foreign_item(mixed: tuple[PtTable, Any]) -> None:
    """The condition is checked in the store at the delete, not only by the read before:
    an item another application wrote between the two is left alone. Redis's script checks
    every attribute; a DynamoDB condition the status and the expiry's type (an attribute
    Powertools never writes is seen by the read before the delete only)."""
    pt, put = mixed
    table = pt.open()
    at = datetime.now(UTC)
    items = {**SESSIONS, **LOOK_ALIKES}
    if pt.name != "redis":
        del items["job-1"]
    for key, values in items.items():
        put(key, values)
        for rule in Rule:
            deleted, _ = table._delete(Delete(key, rule, at, at))
            assert not deleted, (key, rule)
        assert pt.raw(key) is not None
