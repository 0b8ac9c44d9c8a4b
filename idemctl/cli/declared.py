"""A command's parameters built from a declaration of options (``idemctl.kafka.flags``):
each declared field becomes a typer option with its flag, help and default, and the
command receives the fields' values, converted (durations, exception classes), as one
mapping. The options are declared once, in the library's dataclass."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from enum import Enum, StrEnum
from typing import Annotated, Any, TypeVar, cast

import typer

from idemctl.cli.common import duration
from idemctl.errors import ConfigError
from idemctl.kafka.flags import FIELD_DEFAULT, Flag, flag_name, flags

F = TypeVar("F", bound=Callable[..., Any])
DECLARED = "declared"
"""The parameter of the command that receives the declared options' values."""


def declared(options: type, order: Sequence[str]) -> Callable[[F], F]:
    """Give the command the options ``options`` declares, in help order ``order`` with the
    command's own, which names every parameter but ``ctx``; the command takes what was
    given as ``declared`` (a ``Given``)."""
    chosen = list(flags(options))
    hints = typing.get_type_hints(options)
    added = {f.name: _parameter(f, flag, hints[f.name]) for f, flag in chosen}

    def decorate(func: F) -> F:
        own = inspect.signature(func, eval_str=True).parameters
        keyword = inspect.Parameter.KEYWORD_ONLY  # the declared options interleave with these
        params = {n: p.replace(kind=keyword) for n, p in own.items() if n not in ("ctx", DECLARED)}
        params |= added
        params["ctx"] = own["ctx"]
        names = [n for n in params if n != "ctx"]
        if sorted(names) != sorted(order):
            raise AssertionError(f"the help order names {sorted(order)}, not {sorted(names)}")
        shown = [params["ctx"], *(params[n] for n in order)]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = Given(chosen, {f.name: kwargs.pop(f.name) for f, _ in chosen})
            return func(*args, **kwargs, **{DECLARED: given})

        wrapper.__signature__ = inspect.Signature(shown)  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


class Given:
    """What the command line gave for the declared options."""

    def __init__(self, chosen: list[tuple[dataclasses.Field[Any], Flag]], raw: dict[str, Any]):
        self._chosen = chosen
        self.raw = raw
        """Field name -> the command line's value, as typer gave it."""

    def values(self) -> dict[str, Any]:
        """Field name -> the field's value (durations in seconds, exception classes): the
        options' own errors (ConfigError) come from here, in the command's body."""
        return {f.name: _value(f, flag, self.raw[f.name]) for f, flag in self._chosen}


def _parameter(field: dataclasses.Field[Any], flag: Flag, kind: Any) -> inspect.Parameter:
    """The command's parameter for ``field`` (of type ``kind``)."""
    if flag.given is not FIELD_DEFAULT:
        default = flag.given
    elif field.default is not dataclasses.MISSING:
        default = field.default
    else:
        default = inspect.Parameter.empty  # required
    if flag.kind == "duration":
        kind = str | None if default is None else str
    elif flag.kind == "exceptions":
        kind = list[str] | None
    elif flag.choices:
        choice = StrEnum(_camel(field.name), {c.upper(): c for c in flag.choices})  # type: ignore[misc]
        kind, default = choice, choice(default)
    settings: dict[str, Any] = {"help": flag.help}
    if flag.metavar is not None:
        settings["metavar"] = flag.metavar
    if flag.least is not None:
        settings["min"] = flag.least
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, typer.Option(flag_name(field, flag), **settings)],
    )


def _value(field: dataclasses.Field[Any], flag: Flag, value: Any) -> Any:
    """The field's value for what the command line gave."""
    name = flag_name(field, flag)
    if flag.kind == "duration":
        return None if value is None else duration(value, name)
    if flag.kind == "exceptions":
        return tuple(_exception(name, path) for path in value or ())
    if flag.choices:  # the enum's member, or its text where typer leaves it (typer 0.16)
        return value.value if isinstance(value, Enum) else value
    return value


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def _exception(option: str, path: str) -> type[BaseException]:
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError):
        raise ConfigError(f"{option} {path!r}: no such exception class") from None
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise ConfigError(f"{option} {path!r} is not an exception class")
    return found
