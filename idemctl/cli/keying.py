"""The options that say how a message's key is derived, shared by the commands that must
derive it alike: ``consume`` keys messages with them, ``audit`` looks the keys up again."""

from __future__ import annotations

from typing import Annotated

import typer

KeyOption = Annotated[
    str,
    typer.Option(
        "--key",
        metavar="STRATEGY",
        help="Key strategy: header:NAME, template:{field}:{field}, payload-hash, offset",
    ),
]
OnMissingKeyOption = Annotated[
    str,
    typer.Option(
        "--on-missing-key",
        metavar="ACTION",
        help="A message without a usable key, or with an unreadable payload: dlq, offset "
        "(topic-partition-offset as its key), skip or stop",
    ),
]
OrderKeyOption = Annotated[
    str | None,
    typer.Option(
        "--order-key",
        metavar="TEMPLATE",
        help="Sequence guard: the entity an event changes, e.g. account:{account_id} or "
        "header:NAME; with --sequence, an event older than the entity's last applied one "
        "is not run (stale)",
    ),
]
SequenceOption = Annotated[
    str | None,
    typer.Option(
        "--sequence",
        metavar="FIELD",
        help="Sequence guard: the event's sequence, a payload field or header:NAME "
        "(whole numbers or ISO 8601 timestamps)",
    ),
]
