"""``dynamodb://TABLE?region=...&endpoint_url=...``: the store with no server to run.

A new key costs two requests (claim, complete) and a duplicate one, as Powertools for AWS
Lambda's idempotency layer does: claim is one conditional UpdateItem that answers a
conflict with the existing item (``ReturnValuesOnConditionCheckFailure=ALL_OLD``).
Unlike Powertools, complete, fail, extend and release check the owner and fencing token.

Time is the client's clock (DynamoDB has none to ask): leases and retention tolerate the
skew between workers' clocks, which NTP keeps to milliseconds. DynamoDB's TTL deletes
expired items hours late, so expiry is judged here, by ``expires_at``.

A module per job: ``client`` makes the boto3 client and turns botocore's errors into
idemctl's; ``items`` converts records to and from items. DynamoDBStore (``store``: the
protocol) stands on ``core`` (client, table, requests, time), with the operator's
operations in ``admin``, the sparse index of keys in progress they read in ``inprogress``
(what keeps the operator's commands from scanning the table), the sequence guard in
``entities``, and provisioning and health in ``provision``.
"""

from __future__ import annotations

from idemctl.stores.dynamodb.core import DEFAULT_CONCURRENCY
from idemctl.stores.dynamodb.items import NAMES
from idemctl.stores.dynamodb.store import DynamoDBStore

ITEMS_PER_BATCH = 100
"""Records an admin batch reports progress for. Read from here at every call: it may be set."""

__all__ = ["DEFAULT_CONCURRENCY", "ITEMS_PER_BATCH", "NAMES", "DynamoDBStore"]
