"""Fenced writes to your own DynamoDB table: a PutItem and an UpdateItem whose condition
refuses a writer whose fencing token is older than the item's.

The item carries the fence as two attributes, ``idemctl_key`` and ``idemctl_token``, set by
the same request that writes it; DynamoDB checks the condition and writes in one step.
A refusal asks for the item as it was (``ReturnValuesOnConditionCheckFailure``), so the
error names the token that won, with no second read.

- :func:`fenced_put_item` writes a whole item (a ledger entry): it lands if no item is
  there or the one there is this key's with an older token (a dead attempt's, which it
  replaces); StaleFence if a newer attempt of the key wrote it, FenceConflict if another
  key did.
- :func:`fenced_update_item` sets attributes (``SET #a = :a, ...``) as UpdateItem does
  (creating the item if missing); StaleFence if a newer attempt of the same key wrote it;
  another key's item is updated (tokens of two keys are never compared).
- :func:`fence_condition` gives the condition and the stamp as expression parts, for an
  UpdateItem or TransactWriteItems of your own.

``dynamodb`` is a boto3 client (values are plain Python, serialized here) or a boto3
``Table`` resource (then ``table`` is left out).

    from idemctl.fence.dynamodb import fenced_put_item

    def charge(event, ctx):
        fenced_put_item(ddb, {"payment": ctx.key, "cents": 100}, ctx.fence, table="charges")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from idemctl.errors import StaleFence
from idemctl.fence import Fence, FenceConflict

__all__ = ["FenceExpressions", "fence_condition", "fenced_put_item", "fenced_update_item"]

KEY_ATTRIBUTE = "idemctl_key"
TOKEN_ATTRIBUTE = "idemctl_token"  # noqa: S105 - an attribute name


@dataclass(frozen=True)
class FenceExpressions:
    """The fence as parts of a DynamoDB request (values plain Python)."""

    condition: str
    """The ``ConditionExpression``: the write lands only if the fence lets it."""
    stamp: str
    """``#idemctl_key = :idemctl_key, #idemctl_token = :idemctl_token``, for a SET clause."""
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


def fence_condition(fence: Fence, *, insert: bool = False) -> FenceExpressions:
    """The condition and the stamp of a fenced write. ``insert``: only this key may have
    written the item (a ledger entry); else any other key's item is accepted."""
    names = {"#idemctl_key": KEY_ATTRIBUTE, "#idemctl_token": TOKEN_ATTRIBUTE}
    values = {":idemctl_key": fence.key, ":idemctl_token": fence.token}
    mine = "(#idemctl_key = :idemctl_key AND #idemctl_token <= :idemctl_token)"
    other = "" if insert else "#idemctl_key <> :idemctl_key OR "
    condition = f"attribute_not_exists(#idemctl_key) OR {other}{mine}"
    stamp = "#idemctl_key = :idemctl_key, #idemctl_token = :idemctl_token"
    return FenceExpressions(condition, stamp, names, values)


def _is_table(dynamodb: Any) -> bool:
    return hasattr(dynamodb, "table_name")


def _serialized(dynamodb: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    if _is_table(dynamodb):
        return dict(values)
    from boto3.dynamodb.types import TypeSerializer

    serialize = TypeSerializer().serialize
    return {k: serialize(v) for k, v in values.items()}


def _send(
    dynamodb: Any, method: str, table: str | None, request: dict[str, Any], fence: Fence
) -> None:
    from botocore.exceptions import ClientError

    if not _is_table(dynamodb):
        if table is None:
            raise ValueError("table= names the table when dynamodb is a client")
        request["TableName"] = table
    name = dynamodb.table_name if _is_table(dynamodb) else table
    try:
        getattr(dynamodb, method)(**request, ReturnValuesOnConditionCheckFailure="ALL_OLD")
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        raise _refusal(str(name), fence, e.response.get("Item")) from None


def _refusal(table: str, fence: Fence, old: Mapping[str, Any] | None) -> Exception:
    """The error a refused write means, from the item as it was (low-level form)."""
    old = old or {}
    key = (old.get(KEY_ATTRIBUTE) or {}).get("S")
    token = (old.get(TOKEN_ATTRIBUTE) or {}).get("N")
    if key is not None and key != fence.key:
        return FenceConflict(
            f"fenced write to {table} refused for key {fence.key!r}: the item was written "
            f"under key {key!r}"
        )
    return StaleFence(table, fence.key, fence.token, int(token) if token is not None else -1)


def fenced_put_item(
    dynamodb: Any, item: Mapping[str, Any], fence: Fence, *, table: str | None = None
) -> None:
    """PutItem ``item`` stamped with the fence; see the module's docstring for when it is
    refused."""
    if KEY_ATTRIBUTE in item or TOKEN_ATTRIBUTE in item:
        raise ValueError(f"the item names the fence's own attributes: {sorted(item)}")
    f = fence_condition(fence, insert=True)
    stamped = {**item, KEY_ATTRIBUTE: fence.key, TOKEN_ATTRIBUTE: fence.token}
    request = {
        "Item": _serialized(dynamodb, stamped),
        "ConditionExpression": f.condition,
        "ExpressionAttributeNames": f.names,
        "ExpressionAttributeValues": _serialized(dynamodb, f.values),
    }
    _send(dynamodb, "put_item", table, request, fence)


def fenced_update_item(
    dynamodb: Any,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    fence: Fence,
    *,
    table: str | None = None,
) -> None:
    """UpdateItem ``key``: ``SET`` each of ``values`` and the fence; see the module's
    docstring for when it is refused."""
    if not values:
        raise ValueError("fenced_update_item needs values to set")
    f = fence_condition(fence)
    names = dict(f.names)
    bound = dict(f.values)
    sets = []
    for i, (attribute, value) in enumerate(values.items()):
        names[f"#v{i}"], bound[f":v{i}"] = attribute, value
        sets.append(f"#v{i} = :v{i}")
    request = {
        "Key": _serialized(dynamodb, key),
        "UpdateExpression": "SET " + ", ".join([*sets, f.stamp]),
        "ConditionExpression": f.condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": _serialized(dynamodb, bound),
    }
    _send(dynamodb, "update_item", table, request, fence)
