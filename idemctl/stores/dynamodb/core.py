"""What every part of the DynamoDB store stands on: its client and table, its requests
with their errors translated, and the time it writes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import ConfigError
from idemctl.stores.base import DEFAULT_LEASE, DEFAULT_RETENTION, BaseStore
from idemctl.stores.dynamodb.client import condition_failed, make_client, translate
from idemctl.stores.dynamodb.items import names_in, s, to_ms

DEFAULT_CONCURRENCY = 16
"""Requests of one claim_many or complete_many in flight at once (URL option concurrency=)."""


class DynamoDBCore(BaseStore):
    """The base of DynamoDBStore's parts: settings, client, requests, time."""

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
        self.client: Any = make_client(
            self.url,
            region=region,
            endpoint_url=endpoint_url,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_attempts=max_attempts,
            max_pool_connections=max(10, concurrency),  # a batch's requests at once
        )

    def _call(self, operation: str, **kwargs: Any) -> Any:
        """One request; botocore's errors become idemctl's. A failed condition comes back
        as the ClientError, for the caller to read the item it carries."""
        try:
            return getattr(self.client, operation)(TableName=self.table, **kwargs)
        except ClientError as exc:
            if condition_failed(exc):
                raise
            raise translate(exc, self.table, self.url) from exc
        except BotoCoreError as exc:
            raise translate(exc, self.table, self.url) from exc

    def _update(
        self, key: str, update: str, condition: str, values: dict[str, Any], returns: str
    ) -> dict[str, Any]:
        """A conditional UpdateItem: the item as ``returns`` asks, or ClientError with ALL_OLD."""
        expression = update + " " + condition
        response = self._call(
            "update_item",
            Key={"key": s(key)},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeNames=names_in(expression),
            ExpressionAttributeValues=values,
            ReturnValues=returns,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return response.get("Attributes", {})  # type: ignore[no-any-return]

    def _now(self) -> int:
        return to_ms(time.time())

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        self.client.close()
