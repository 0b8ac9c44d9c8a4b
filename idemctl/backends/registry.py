"""The backends' registry: ``Backend``, ``register`` and the lookups by scheme, URL and
name. The families register themselves on it (``idemctl.backends``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from idemctl.errors import ConfigError, MissingDriver
from idemctl.urls import redact_url, split_url


@dataclass(frozen=True)
class Backend:
    """A family of stores and where its parts live."""

    name: str
    """The family's name: its store class's ``scheme``."""
    schemes: tuple[str, ...]
    """The URL schemes it answers (``redis``, ``rediss``, ``redis+cluster``)."""
    store: str
    """The ``Store`` class, with a ``from_url(url)``."""
    driver: str | None = None
    """The Python package its store needs, and the extra that installs it."""
    extra: str | None = None
    async_store: str | None = None
    """The class of its native asyncio store, over the sync store (else threads)."""
    in_process: bool = False
    """Its store lives in this process: one worker thread serves its async calls."""
    shared: bool = True
    """Other processes open the same store by its URL (not so ``memory://``: audit and
    verify refuse it)."""
    transactional: bool = False
    """It has transactional mode (``run(..., transactional=True)``, ``--transactional``)."""
    credentials_fix: str = "check the URL's user, password and database name"
    """What ``doctor`` says to do when the server refuses the credentials."""
    layouts: Mapping[str, str] = field(default_factory=dict)
    """Other applications' layouts it can open (``layout=NAME``): a ``from_url(url, options,
    layout)`` class each."""
    scratch: str | None = None
    """``verify``'s scratch room class (``idemctl.harness.rooms.Room``)."""

    def load(self, part: str) -> Any:
        """The class named by this backend's ``part`` ("store", "async_store", ...),
        imported now; MissingDriver naming the extra where its driver is not installed."""
        target = getattr(self, part)
        assert isinstance(target, str), (self.name, part)
        return self._import(target)

    def load_layout(self, name: str) -> Any:
        if name not in self.layouts:
            raise KeyError(name)
        return self._import(self.layouts[name])

    def _import(self, target: str) -> Any:
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # psycopg's pool is the psycopg_pool package: one extra installs both.
            if (
                self.driver is not None
                and exc.name is not None
                and exc.name.startswith(self.driver)
            ):
                raise MissingDriver(
                    f"the {self.schemes[0]}:// store needs the {self.driver} package: "
                    f"pip install 'idemctl[{self.extra}]'"
                ) from exc
            raise
        return getattr(module, attribute)


_BY_SCHEME: dict[str, Backend] = {}
_BY_NAME: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Make ``backend``'s schemes open its store (the latest registration of a scheme
    wins)."""
    _BY_NAME[backend.name] = backend
    for scheme in backend.schemes:
        _BY_SCHEME[scheme] = backend


def unregister(backend: Backend) -> None:
    """Forget ``backend``'s schemes (those no later registration took over)."""
    if _BY_NAME.get(backend.name) is backend:
        del _BY_NAME[backend.name]
    for scheme in backend.schemes:
        if _BY_SCHEME.get(scheme) is backend:
            del _BY_SCHEME[scheme]


def schemes() -> list[str]:
    return list(_BY_SCHEME)


def transactional() -> list[str]:
    """The first scheme of each family with transactional mode (``postgresql``)."""
    return [b.schemes[0] for b in _BY_NAME.values() if b.transactional]


def families() -> list[Backend]:
    """Every backend registered, once each."""
    return list(_BY_NAME.values())


def for_url(url: str) -> Backend:
    """The backend of ``url``'s scheme; ConfigError naming the known ones."""
    scheme = split_url(url).scheme.lower()
    found = _BY_SCHEME.get(scheme)
    if found is None:
        known = ", ".join(f"{s}://" for s in _BY_SCHEME)
        raise ConfigError(f"unknown store scheme {scheme!r} in {redact_url(url)}; known: {known}")
    return found


def layout_of(url: str) -> str | None:
    """The layout ``url`` asks for (``layout=powertools``), lower case; None for idemctl's
    own."""
    if "://" not in url:
        return None
    layout = dict(parse_qsl(split_url(url).query, keep_blank_values=True)).get("layout")
    return None if layout is None else layout.lower()


def named(name: str) -> Backend | None:
    """The backend whose store class says ``scheme = name``."""
    return _BY_NAME.get(name)
