"""What every part of the DynamoDB store stands on: its client and table, its requests
with their errors translated, and the time it writes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import ConfigError
from idemctl.stores.base import BaseStore
from idemctl.stores.dynamodb.client import condition_failed, make_client, translate
from idemctl.stores.dynamodb.items import names_in, s, to_ms
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION

T = TypeVar("T")

DEFAULT_CONCURRENCY = 16
"""Requests of one claim_many, complete_many, guard_many or settle_many in flight at once
(URL option concurrency=)."""


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

    def _now(self) -> int:
        return to_ms(time.time())

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        self.client.close()
