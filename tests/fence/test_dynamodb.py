"""idemctl.fence.dynamodb on moto's DynamoDB server over HTTP: the fenced PutItem and
UpdateItem, through a boto3 client and a Table resource."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idemctl.errors import StaleFence
from idemctl.fence import Fence, FenceConflict
from idemctl.fence.dynamodb import fence_condition, fenced_put_item, fenced_update_item
from tests.servers import MotoServer


def make_table(client: Any) -> str:
    name = f"charges-{uuid.uuid4().hex[:10]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "payment", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "payment", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


@pytest.fixture
def ddb(moto_server: MotoServer) -> Iterator[tuple[Any, str]]:
    client = moto_server.client()
    table = make_table(client)
    yield client, table
    client.delete_table(TableName=table)


def item(client: Any, table: str, payment: str) -> dict[str, Any]:
    got = client.get_item(TableName=table, Key={"payment": {"S": payment}}, ConsistentRead=True)
    from boto3.dynamodb.types import TypeDeserializer

    return {k: TypeDeserializer().deserialize(v) for k, v in got["Item"].items()}


def test_a_fenced_put_replaces_a_dead_attempts_item_and_refuses_a_late_one(
    ddb: tuple[Any, str],
) -> None:
    client, table = ddb
    fenced_put_item(client, {"payment": "p", "cents": 1}, Fence("p", 1), table=table)
    fenced_put_item(client, {"payment": "p", "cents": 2}, Fence("p", 2), table=table)
    with pytest.raises(StaleFence) as refused:
        fenced_put_item(client, {"payment": "p", "cents": 3}, Fence("p", 1), table=table)
    assert (refused.value.resource, refused.value.token, refused.value.last) == (table, 1, 2)
    with pytest.raises(FenceConflict, match="under key 'p'"):
        fenced_put_item(client, {"payment": "p", "cents": 4}, Fence("q", 9), table=table)
    assert item(client, table, "p") == {
        "payment": "p",
        "cents": 2,
        "idemctl_key": "p",
        "idemctl_token": 2,
    }


def test_a_fenced_update_refuses_an_older_token_of_the_same_key_only(
    ddb: tuple[Any, str],
) -> None:
    client, table = ddb
    key = {"payment": "acct"}
    fenced_update_item(client, key, {"balance": 10}, Fence("k", 5), table=table)  # created
    with pytest.raises(StaleFence):
        fenced_update_item(client, key, {"balance": 99}, Fence("k", 4), table=table)
    fenced_update_item(client, key, {"balance": 20, "note": "x"}, Fence("j", 1), table=table)
    got = item(client, table, "acct")
    assert (got["balance"], got["note"], got["idemctl_key"], got["idemctl_token"]) == (
        20,
        "x",
        "j",
        1,
    )


def test_a_table_resource_works_alike(moto_server: MotoServer) -> None:
    import boto3

    client = moto_server.client()
    name = make_table(client)
    try:
        resource = boto3.resource(
            "dynamodb", endpoint_url=moto_server.endpoint_url, region_name="us-east-1"
        )
        t = resource.Table(name)
        fenced_put_item(t, {"payment": "p", "cents": 1}, Fence("p", 3))
        with pytest.raises(StaleFence) as refused:
            fenced_put_item(t, {"payment": "p", "cents": 2}, Fence("p", 2))
        assert refused.value.last == 3
        fenced_update_item(t, {"payment": "p"}, {"cents": 5}, Fence("p", 4))
        assert item(client, name, "p")["cents"] == 5
    finally:
        client.delete_table(TableName=name)


def test_the_condition_for_a_request_of_your_own(ddb: tuple[Any, str]) -> None:
    from boto3.dynamodb.types import TypeSerializer

    client, table = ddb
    f = fence_condition(Fence("k", 7))
    s = TypeSerializer().serialize
    request = {
        "TableName": table,
        "Key": {"payment": {"S": "own"}},
        "UpdateExpression": "SET #n = :n, " + f.stamp,
        "ConditionExpression": f.condition,
        "ExpressionAttributeNames": {**f.names, "#n": "n"},
        "ExpressionAttributeValues": {k: s(v) for k, v in {**f.values, ":n": 1}.items()},
    }
    client.update_item(**request)
    assert item(client, table, "own")["idemctl_token"] == 7


def test_bad_calls_are_refused_before_sending(ddb: tuple[Any, str]) -> None:
    client, table = ddb
    with pytest.raises(ValueError, match="table="):
        fenced_put_item(client, {"payment": "p"}, Fence("p", 1))
    with pytest.raises(ValueError, match="fence's own attributes"):
        fenced_put_item(client, {"payment": "p", "idemctl_token": 1}, Fence("p", 1), table=table)
    with pytest.raises(ValueError, match="values to set"):
        fenced_update_item(client, {"payment": "p"}, {}, Fence("p", 1), table=table)
