"""Key strategies: where a message's idempotency key comes from.

- ``header:NAME`` (default ``header:idempotency-key``): the header's value, UTF-8;
- ``template:{tenant_id}:{txn_id}:{op}``: fields of the JSON payload (dotted paths allowed);
- ``payload-hash``: SHA-256 of the payload's canonical JSON (of its bytes if not JSON);
- ``offset``: ``topic-partition-offset``, for topics without a business key (this guards
  against redelivery of the same record, not against a producer sending it twice).

A strategy that finds no key raises MissingKey; the consumer applies ``--on-missing-key``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from idemctl.errors import ConfigError, InvalidKey, InvalidPayload
from idemctl.frozen import frozen
from idemctl.model import (
    Order,
    fingerprint,
    parse_json,
    parsed_fingerprint,
    sequence_of,
    validate_key,
)

DEFAULT_KEY_STRATEGY = "header:idempotency-key"
_FIELD = re.compile(r"\{([^{}]+)\}")


class MissingKey(InvalidKey):
    """The message carries no usable idempotency key under the chosen strategy."""


class MissingField(MissingKey):
    """A JSON object without a field the key template names: on the first message, the
    sign of a template that cannot work rather than of one bad message."""


@frozen
class Message:
    """What a key strategy may look at."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()

    @functools.cached_property
    def payload(self) -> Any:
        """The JSON payload, parsed once for every strategy that reads it; MissingKey
        without one, InvalidPayload when it is not JSON."""
        if self.value is None:
            raise MissingKey("the message has no payload")
        try:
            return parse_json(self.value)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidPayload(f"the payload is not JSON: {exc}") from None

    def fingerprint(self) -> str | None:
        """The payload's fingerprint (None without one), from its parsed JSON when a
        strategy parsed it already: the same as ``model.fingerprint(value)``."""
        if self.value is None:
            return None
        if "payload" in self.__dict__:  # parsed, and cached, by cached_property
            return parsed_fingerprint(self.__dict__["payload"])
        return fingerprint(self.value)


KeyStrategy = Callable[[Message], str]


def key_strategy(spec: str) -> KeyStrategy:
    """The strategy ``spec`` names, or ConfigError saying which forms exist."""
    kind, _, arg = spec.partition(":")
    if kind == "header" and arg:
        return lambda m: _from_header(m, arg)
    if kind == "template" and _FIELD.search(arg):
        return _template(arg)
    if spec == "payload-hash":
        return _from_payload_hash
    if spec == "offset":
        return lambda m: f"{m.topic}-{m.partition}-{m.offset}"
    raise ConfigError(
        f"unknown key strategy {spec!r}: use header:NAME, template:{{field}}:{{field}}, "
        "payload-hash or offset"
    )


def unusable_reason(exc: InvalidKey | InvalidPayload) -> str:
    """A dead letter's reason for a message no key can be had from: ``exc`` is what the key
    strategy (or the fingerprint) raised."""
    if isinstance(exc, MissingKey):
        return "no idempotency key"
    if isinstance(exc, InvalidKey):
        return "invalid idempotency key"
    return "unreadable payload"


def _from_header(m: Message, name: str) -> str:
    values = [v for k, v in m.headers if k == name]
    if not values or values[-1] is None:
        raise MissingKey(f"no {name!r} header")
    try:
        return validate_key(values[-1].decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidKey(f"header {name!r} is not UTF-8: {values[-1][:60]!r}") from None


def _template(template: str) -> Callable[[Message], str]:
    """A key template compiled once: its literal parts and its fields' dotted paths."""
    parts = _FIELD.split(template)  # literal, field, literal, field, ..., literal
    literals, fields = parts[0::2], [(f, f.split(".")) for f in parts[1::2]]

    def fill(m: Message) -> str:
        payload = _json(m)
        if not isinstance(payload, dict):
            raise MissingKey("the payload is not a JSON object, so the key template has no fields")
        out = [literals[0]]
        for (name, path), literal in zip(fields, literals[1:], strict=True):
            value: Any = payload
            for part in path:
                if not isinstance(value, dict) or part not in value:
                    raise MissingField(f"the payload has no field {name!r}")
                value = value[part]
            if value is None or isinstance(value, dict | list):
                raise MissingField(f"field {name!r} is not a scalar")
            out += (str(value), literal)
        return validate_key("".join(out))

    return fill


def _from_payload_hash(m: Message) -> str:
    if m.value is None:
        raise MissingKey("the message has no payload to hash")
    return fingerprint(m.value)


def _json(m: Message) -> Any:
    return m.payload


OrderStrategy = Callable[[Message], Order]


def order_strategy(entity: str, sequence: str) -> OrderStrategy:
    """Where an event's entity and sequence come from, for the sequence guard.

    ``entity``: ``header:NAME``, or a template over the JSON payload's fields such as
    ``account:{account_id}``. ``sequence``: ``header:NAME`` or a payload field (dotted
    paths allowed), holding a whole number or an ISO 8601 timestamp. A message lacking
    either raises MissingKey; one whose sequence is unreadable, InvalidPayload."""
    entity_of: Callable[[Message], str]
    if entity.startswith("header:") and entity[7:]:
        name = entity[7:]
        entity_of = lambda m: _from_header(m, name)  # noqa: E731 - one of two forms
    elif _FIELD.search(entity):
        entity_of = _template(entity)
    else:
        raise ConfigError(
            f"--order-key {entity!r} names no field: use header:NAME or a template such as "
            "account:{account_id}"
        )
    if sequence.startswith("header:") and sequence[7:]:
        header = sequence[7:]

        def sequence_of_(m: Message) -> int:
            values = [v for k, v in m.headers if k == header]
            if not values or values[-1] is None:
                raise MissingKey(f"no {header!r} header for the sequence")
            return sequence_of(values[-1])

    elif sequence and not sequence.startswith("header:"):

        def sequence_of_(m: Message) -> int:
            value: Any = _json(m)
            for part in sequence.split("."):
                if not isinstance(value, dict) or part not in value:
                    raise MissingKey(f"the payload has no sequence field {sequence!r}")
                value = value[part]
            if value is None:
                raise MissingKey(f"sequence field {sequence!r} is null")
            return sequence_of(value)

    else:
        raise ConfigError(f"--sequence {sequence!r}: use a payload field or header:NAME")

    def order(m: Message) -> Order:
        return Order(entity_of(m), sequence_of_(m))

    return order
