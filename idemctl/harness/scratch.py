"""Where ``idemctl verify`` keeps its keys: a namespace of the user's store that nothing else
uses, made from their URL by the backend family's room (``idemctl.harness.rooms``), and
removed again without touching anything beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemctl import backends
from idemctl.errors import ConfigError, Refused
from idemctl.harness.rooms import with_option
from idemctl.stores import open_store
from idemctl.urls import redact_url, split_url

if TYPE_CHECKING:
    from idemctl.harness.rooms import Room
    from idemctl.stores.base import Store

__all__ = ["Scratch", "with_option"]  # with_option: the tests build URLs with it


class Scratch:
    """The scratch namespace of run ``run`` in the store at ``url``."""

    def __init__(self, url: str, run: str, default_store: bool = False) -> None:
        backend = backends.for_url(url)
        if backend.scratch is None:
            scheme = split_url(url).scheme.lower()
            raise ConfigError(f"verify does not know how to make scratch room in {scheme}://")
        self.run = run
        self.room: Room = backend.load("scratch")(url, run, default_store)
        self.url: str = self.room.url
        self.path = self.room.path

    @property
    def shown(self) -> str:
        return redact_url(self.url)

    @property
    def ledger_table(self) -> str | None:
        """The transactional ledger's table, schema-qualified and quoted (PostgreSQL)."""
        return self.room.ledger_table

    def store(self) -> Store:
        """The scratch store, opened (a context manager: closed after the block)."""
        return open_store(self.url)

    def refuse_if_used(self) -> None:
        """Refused when the namespace holds anything: verify never runs among keys it did
        not write."""
        if self.room.exists():
            raise Refused(
                f"the scratch namespace {self.shown} already exists: choose another --run-id"
            )

    def provision(self, transactional_ledger: bool) -> None:
        self.room.provision(transactional_ledger)

    def keys_left(self) -> int:
        """How many keys, tables or files of this run the store still holds."""
        return self.room.left()

    def remove(self) -> None:
        """Delete everything of this run: its file, keys, tables or table."""
        self.room.remove()
