"""How a consume option is given on the command line, declared once beside its field.

``Handling`` (``idemctl.kafka.options``) and ``ConsumeOptions`` (``idemctl.consume.options``)
are the declaration of consume's options: each field that ``idemctl consume`` takes carries
a ``Flag`` in its metadata (``option()``). The CLI builds its parameters from them
(``idemctl.cli.declared``), the FastStream middleware takes a ``Handling``, and
``--processes`` gives its workers the options as given, from the same parameters. No typer
here: the library declares, the CLI renders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["plain", "duration", "exceptions"]
"""How the command line's text becomes the field's value: as it is (typer converts numbers
and flags), a duration (``30s``) in seconds, or exception classes (``MODULE.CLASS``)."""


class _FieldDefault:
    def __repr__(self) -> str:
        return "the field's default"


FIELD_DEFAULT: Any = _FieldDefault()
"""``Flag.given`` where the command line's default is the field's own."""


@dataclass(frozen=True)
class Flag:
    """One option of ``idemctl consume``."""

    help: str
    metavar: str | None = None
    name: str | None = None
    """The flag; default: ``--`` and the field's name with dashes."""
    kind: Kind = "plain"
    given: Any = FIELD_DEFAULT
    """The command line's default where it is not the field's (a duration as text)."""
    least: int | None = None
    """The least whole number typer accepts."""
    choices: tuple[str, ...] = ()


def option(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None,
           **flag: Any) -> Any:  # fmt: skip
    """A dataclass field that ``idemctl consume`` takes as an option (``Flag``'s fields)."""
    metadata = {"flag": Flag(**flag)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flags(options: type) -> Iterator[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of dataclass ``options`` that the command line takes, with their flags."""
    for f in dataclasses.fields(options):
        flag = f.metadata.get("flag")
        if flag is not None:
            yield f, flag


def flag_name(field: dataclasses.Field[Any], flag: Flag) -> str:
    return flag.name or "--" + field.name.replace("_", "-")
