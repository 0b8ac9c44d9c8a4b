"""How idemctl's commands read in ``--help``, the same on every typer version allowed.

typer 0.28 and later print a type tag beside every option that has no metavar: ``<str>``,
``<int>``, and ``<bool>`` beside flags (typer's own ``--help`` included), which take no
value at all. idemctl names what every value option takes (``--store URL``, ``--lease
DUR``); the classes here give flags and counters an empty metavar, so nothing stands beside
them, whichever typer renders the help.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def _quiet(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
    return params


class QuietCommand(TyperCommand):
    """A command whose flags and counters show no metavar."""

    def get_params(self, ctx: typer.Context) -> list[Any]:  # type: ignore[override]
        return _quiet(super().get_params(ctx))


class QuietGroup(TyperGroup):
    """A command group (the root, ``outbox``) whose flags show no metavar."""

    def get_params(self, ctx: typer.Context) -> list[Any]:  # type: ignore[override]
        return _quiet(super().get_params(ctx))
