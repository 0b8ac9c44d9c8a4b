"""``powertools_key`` gives the key Powertools itself stored for a payload: each case is
written by Powertools' ``idempotent_function`` into an empty Redis database, and the one key
there is compared with idemctl's."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest

from idemctl.errors import ConfigError
from idemctl.powertools import powertools_key
from tests.powertools.conftest import PtTable
from tests.powertools.writers import call, function_name, key_of

ORDER = {"order_id": "o-17", "customer": "c-1", "amount": 12.5, "items": [{"sku": "é", "n": 2}]}
BODY = {"body": json.dumps({"order_id": "o-17", "items": [1, 2]}), "headers": {"x": "y"}}
INNER = json.dumps({"order_id": "o-5", "n": [1, 2]}).encode()
ENCODED = {
    "b64": base64.b64encode(INNER).decode(),
    "gz": base64.b64encode(gzip.compress(INNER)).decode(),
}

CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "whole payload, md5": (ORDER, {}),
    "whole payload, sha256": (ORDER, {"hash_function": "sha256"}),
    "jmespath field": (ORDER, {"event_key_jmespath": "order_id"}),
    "jmespath powertools_json": (BODY, {"event_key_jmespath": "powertools_json(body).order_id"}),
    "jmespath powertools_json, sha256": (
        BODY,
        {"event_key_jmespath": "powertools_json(body).order_id", "hash_function": "sha256"},
    ),
    "jmespath multi-select list": (ORDER, {"event_key_jmespath": "[customer, order_id]"}),
    "jmespath multi-select hash": (ORDER, {"event_key_jmespath": "{o: order_id, c: customer}"}),
    "jmespath sub-object": (ORDER, {"event_key_jmespath": "items[0]"}),
    "jmespath powertools_base64": (
        ENCODED,
        {"event_key_jmespath": "powertools_json(powertools_base64(b64)).order_id"},
    ),
    "jmespath powertools_base64_gzip": (
        ENCODED,
        {"event_key_jmespath": "powertools_json(powertools_base64_gzip(gz))"},
    ),
    "key prefix": (ORDER, {"key_prefix": "orders"}),
    "key prefix, jmespath, sha256": (
        BODY,
        {
            "key_prefix": "orders-v2",
            "event_key_jmespath": "powertools_json(body).order_id",
            "hash_function": "sha256",
        },
    ),
    "nested qualname": (ORDER, {"function": "Orders.handle"}),
    "string payload": ("order-17", {}),
    "list payload": ([3, 1, {"b": 1, "a": 2}], {}),
}


def stored_key(redis_pt: PtTable, redis_client: Any, payload: Any, **options: Any) -> str:
    """The one key Powertools wrote for ``payload`` in the empty database."""
    assert redis_client.dbsize() == 0
    job = redis_pt.job(payload, **options)
    assert call(job).kind == "ran"
    keys = redis_client.keys("*")
    assert len(keys) == 1, keys
    assert keys[0] == key_of(job)
    redis_client.flushdb()
    return str(keys[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_key_is_the_one_powertools_stored(redis_pt: PtTable, redis_client: Any, case: str) -> None:
    payload, options = CASES[case]
    stored = stored_key(redis_pt, redis_client, payload, **options)
    function = function_name(redis_pt.job(payload, **options))
    key = powertools_key(
        payload,
        function,
        key_prefix=options.get("key_prefix"),
        event_key_jmespath=options.get("event_key_jmespath"),
        hash_function=options.get("hash_function", "md5"),
    )
    assert key == stored
    prefix = options.get("key_prefix") or f"test-func.{function}"
    assert key.startswith(prefix + "#")


def test_key_with_the_lambda_function_name(
    redis_pt: PtTable, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In Lambda, Powertools puts AWS_LAMBDA_FUNCTION_NAME where ``test-func`` is."""
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    stored = stored_key(redis_pt, redis_client, ORDER)
    function = "tests.powertools.writers.process"
    assert stored.startswith(f"orders-fn.{function}#")
    assert powertools_key(ORDER, function, lambda_function_name="orders-fn") == stored
    assert powertools_key(ORDER, function) != stored


def test_the_readmes_walk_through(redis_pt: PtTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key README's stuck-INPROGRESS walk-through prints, as Powertools computes it for
    ``app.lambda_handler`` of the Lambda function ``orders-api``."""
    event = {"body": json.dumps({"order_id": "o-1001", "cents": 2500})}
    expression = "powertools_json(body).order_id"
    readme = "orders-api.app.lambda_handler#caf6f8c0c56053333aecfd7a240e0293"
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-api")
    job = redis_pt.job(event, event_key_jmespath=expression)
    assert key_of(job, "app.lambda_handler") == readme
    key = powertools_key(
        event,
        "app.lambda_handler",
        lambda_function_name="orders-api",
        event_key_jmespath=expression,
    )
    assert key == readme


def test_no_key_where_powertools_keeps_no_record(redis_pt: PtTable, redis_client: Any) -> None:
    """A JMESPath that selects nothing: Powertools runs the function and stores nothing;
    idemctl says there is no key rather than inventing one."""
    job = redis_pt.job(ORDER, event_key_jmespath="missing_field")
    assert call(job).kind == "ran"
    assert redis_client.dbsize() == 0
    with pytest.raises(ConfigError):
        powertools_key(ORDER, function_name(job), event_key_jmespath="missing_field")


def test_different_payloads_different_keys() -> None:
    function = "app.handler"
    assert powertools_key({"a": 1}, function) != powertools_key({"a": 2}, function)
    assert powertools_key({"a": 1, "b": 2}, function) == powertools_key({"b": 2, "a": 1}, function)
    with pytest.raises(ConfigError):
        powertools_key({"a": 1}, function, hash_function="no-such-hash")
