"""The exit codes of every idemctl command, and which error gives which: one table, in the
library (``consume --processes``' supervisor judges its workers by it), mapped by the CLI and
shown by ``idemctl --help``."""

from __future__ import annotations

from enum import IntEnum

from idemctl.errors import (
    ConfigError,
    ConsumeStopped,
    InvalidCursor,
    InvalidKey,
    InvalidPayload,
    KafkaUnavailable,
    KeyNotFound,
    NotProvisioned,
    Refused,
    StoreUnavailable,
    StuckHandlers,
)


class ExitCode(IntEnum):
    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    STORE_UNREACHABLE = 3
    NOT_PROVISIONED = 4
    KEY_NOT_FOUND = 5
    REFUSED = 6
    KAFKA_UNREACHABLE = 7
    CONSUME_STOPPED = 8
    HANDLERS_STUCK = 9
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.UNEXPECTED: (
        "unexpected error; for doctor, a problem found; for outbox relay and replay, events "
        "not delivered; for verify, a guarantee broken (a key lost, duplicate effects beyond "
        "the guarantee, a poison message not dead-lettered); for verify --http, a point "
        "failed; for audit, messages lost (or of a --fail-on class), or a setup it cannot "
        "judge (most messages without a key under --key, none of the keys in the store)"
    ),
    ExitCode.USAGE: (
        "usage error or bad configuration (URL, scheme, missing driver, config file, a "
        "setting out of its range, credentials or database the server refused, an audited "
        "group that committed nothing on the topic, a verify --http URL that takes no "
        "connection), before anything is written"
    ),
    ExitCode.STORE_UNREACHABLE: "store unreachable",
    ExitCode.NOT_PROVISIONED: (
        "store not provisioned: run 'idemctl init'; with layout=powertools, a table or "
        "database that holds no Powertools records (nothing written)"
    ),
    ExitCode.KEY_NOT_FOUND: "key not found",
    ExitCode.REFUSED: (
        "refused: a live lease without --force, a conflicting state, a declined confirmation, "
        "or verify's scratch topic or keys already there"
    ),
    ExitCode.KAFKA_UNREACHABLE: (
        "Kafka unreachable: no partitions within --join-timeout, the brokers lost that long "
        "under --exit-when-idle, or the Kafka client failed for good"
    ),
    ExitCode.CONSUME_STOPPED: (
        "consume stopped before a message it must not pass: a dead-letter storm "
        "(--dlq-breaker) or --on-missing-key stop"
    ),
    ExitCode.HANDLERS_STUCK: (
        "consume stopped with handlers that did not return (SIGTERM's --drain-timeout passed, "
        "or more handlers passed --handler-timeout's hard limit than --max-abandoned allows): "
        "their messages were left uncommitted and are named; restart it"
    ),
    ExitCode.INTERRUPTED: "interrupted",
}


ERROR_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ExitCode], ...] = (
    (KeyboardInterrupt, ExitCode.INTERRUPTED),
    ((ConfigError, InvalidKey, InvalidPayload, InvalidCursor), ExitCode.USAGE),
    (StoreUnavailable, ExitCode.STORE_UNREACHABLE),
    (NotProvisioned, ExitCode.NOT_PROVISIONED),
    (KeyNotFound, ExitCode.KEY_NOT_FOUND),
    (Refused, ExitCode.REFUSED),
    (KafkaUnavailable, ExitCode.KAFKA_UNREACHABLE),
    (ConsumeStopped, ExitCode.CONSUME_STOPPED),
    (StuckHandlers, ExitCode.HANDLERS_STUCK),
)
"""Exception classes -> exit code, the first that matches winning; any other: UNEXPECTED."""


def exit_code_for(exc: BaseException) -> ExitCode:
    for kinds, code in ERROR_CODES:
        if isinstance(exc, kinds):
            return code
    return ExitCode.UNEXPECTED
