"""The boto3 client of a DynamoDB store, and botocore's errors as idemctl's."""

from __future__ import annotations

import re
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from idemctl.errors import ConfigError, NotProvisioned, StoreError, StoreUnavailable

# Left after botocore's own retries: the store is there but cannot serve now.
_TRANSIENT = (
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
)

# The endpoint refused the request's credentials or signature, or this identity's rights.
_REFUSED = (
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredTokenException",
    "MissingAuthenticationTokenException",
    "IncompleteSignatureException",
    "InvalidAccessKeyId",
    "AuthFailure",
)


def make_client(
    url: str,
    *,
    region: str | None,
    endpoint_url: str | None,
    connect_timeout: float,
    read_timeout: float,
    max_attempts: int,
    max_pool_connections: int,
) -> Any:
    """A DynamoDB client for the store at ``url`` (redacted)."""
    # Throttling and transient errors are retried by botocore's own standard mode; every
    # request here is conditional, and a retried one is recognised (done_by, owner).
    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
    )
    try:
        return boto3.client(
            "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
        )
    except BotoCoreError as exc:
        raise ConfigError(f"DynamoDB store {url}: {exc}") from exc


def condition_failed(exc: ClientError) -> bool:
    """Whether a request was refused by its condition (the error carries the item)."""
    return bool(exc.response.get("Error", {}).get("Code", "") == "ConditionalCheckFailedException")


def translate(exc: ClientError | BotoCoreError, table: str, url: str) -> StoreError | ConfigError:
    """A failed request's error as idemctl's, for the store of ``table`` at ``url``."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            return NotProvisioned(
                f"DynamoDB table {table!r} does not exist ({url}): run 'idemctl init'"
            )
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code, message = _error_of(exc)
        if code in _REFUSED or status == 403:
            return ConfigError(
                f"DynamoDB at {url} refused the request's credentials: {code}: {message}"
            )
        if code in _TRANSIENT:
            return StoreUnavailable(f"DynamoDB at {url} is throttling or failing: {exc}")
        return StoreError(f"DynamoDB at {url}: {exc}")
    if isinstance(exc, NoCredentialsError):
        return ConfigError(f"no AWS credentials for {url}: {exc}")
    # Refused, timed out, or hung up: nothing was decided, so fail closed.
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return StoreUnavailable(f"DynamoDB at {url} is unreachable: {exc}")
    return StoreError(f"DynamoDB at {url}: {exc}")


def _error_of(exc: ClientError) -> tuple[str, str]:
    """An error reply's code and message. An endpoint that answers in AWS's XML error form
    (moto refusing credentials does) has them inside the message."""
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
    inner = re.search(r"<Code>([^<]*)</Code>", message)
    if inner:
        said = re.search(r"<Message>([^<]*)</Message>", message)
        code, message = inner.group(1), said.group(1) if said else ""
    return code, message
