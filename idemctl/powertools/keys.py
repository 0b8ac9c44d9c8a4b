"""The idempotency key Powertools for AWS Lambda (Python) gives a payload, to find one
event's record. Other languages' Powertools hash otherwise (TypeScript: base64 digests of
``JSON.stringify``): their keys are given raw.

Python's rule (``BasePersistenceLayer._get_hashed_idempotency_key``):
``<prefix>#<hexdigest of json.dumps(selected, sort_keys=True)>``, where ``selected`` is the
part of the payload ``event_key_jmespath`` selects (all of it without one), the hash
``hash_function`` (md5 by default), and ``<prefix>`` the decorator's ``key_prefix`` or
``<AWS_LAMBDA_FUNCTION_NAME, 'test-func' outside Lambda>.<module>.<qualname>`` of the
decorated function."""

from __future__ import annotations

import base64
import decimal
import gzip
import hashlib
import json
import math
from collections.abc import Callable
from typing import Any

from idemctl.errors import ConfigError, MissingDriver

OUTSIDE_LAMBDA = "test-func"
"""The function name Powertools uses where AWS_LAMBDA_FUNCTION_NAME is unset."""


def powertools_key(
    payload: Any,
    function: str | None = None,
    *,
    lambda_function_name: str | None = None,
    key_prefix: str | None = None,
    event_key_jmespath: str | None = None,
    hash_function: str = "md5",
) -> str:
    """The key Powertools stores ``payload``'s record under. ``function`` is the decorated
    function's ``module.qualname`` (``app.lambda_handler``, ``orders.process_order``);
    ``key_prefix`` replaces the prefix as the decorator's own argument does."""
    if key_prefix is None:
        if not function:
            raise ConfigError("give the decorated function's module.qualname, or a key prefix")
        key_prefix = f"{lambda_function_name or OUTSIDE_LAMBDA}.{function}"
    selected = _select(payload, event_key_jmespath) if event_key_jmespath else payload
    if _missing(selected):
        raise ConfigError(
            f"the payload has nothing at {event_key_jmespath!r}: Powertools keeps no record "
            "for it (or raises, with raise_on_no_idempotency_key)"
        )
    try:
        digest = hashlib.new(hash_function)
    except ValueError:
        raise ConfigError(f"unknown hash function {hash_function!r} (hashlib's names)") from None
    digest.update(json.dumps(selected, cls=_Encoder, sort_keys=True).encode())
    return f"{key_prefix}#{digest.hexdigest()}"


def _select(payload: Any, expression: str) -> Any:
    try:
        import jmespath  # type: ignore[import-untyped]
        from jmespath import functions
    except ModuleNotFoundError as exc:
        raise MissingDriver(
            "an event key JMESPath needs the jmespath package: pip install 'idemctl[dynamodb]' "
            "or 'idemctl[redis]' (or jmespath)"
        ) from exc

    def string(f: Callable[..., Any]) -> Callable[..., Any]:
        """jmespath's signature of a function of one string."""
        typed: Callable[..., Any] = functions.signature({"types": ["string"]})(f)
        return typed

    class _Functions(functions.Functions):  # type: ignore[misc] # Powertools' (jmespath_utils)
        @string
        def _func_powertools_json(self, value: str) -> Any:
            return json.loads(value)

        @string
        def _func_powertools_base64(self, value: str) -> str:
            return base64.b64decode(value).decode()

        @string
        def _func_powertools_base64_gzip(self, value: str) -> str:
            return gzip.decompress(base64.b64decode(value)).decode()

    try:
        return jmespath.search(
            expression, payload, options=jmespath.Options(custom_functions=_Functions())
        )
    except (jmespath.exceptions.JMESPathError, ValueError) as exc:
        raise ConfigError(f"event key JMESPath {expression!r}: {exc}") from None


def _missing(data: Any) -> bool:
    """Powertools' ``is_missing_idempotency_key``."""
    if isinstance(data, dict):
        return all(x is None for x in data.values())
    if isinstance(data, tuple | list):
        return all(x is None for x in data)
    if isinstance(data, int | float | bool):
        return False
    return not data


class _Encoder(json.JSONEncoder):
    """Powertools' Encoder for what a JSON payload can hold: Decimals (DynamoDB's numbers)
    as strings."""

    def default(self, o: Any) -> Any:
        if isinstance(o, decimal.Decimal):
            return math.nan if o.is_nan() else str(o)
        return super().default(o)
