"""Operate the idempotency tables Powertools for AWS Lambda writes: find, count and free its
records (stuck INPROGRESS ones above all) with Powertools' own rules.

    from idemctl.powertools import open_table, State

    with open_table("dynamodb://idempotency?layout=powertools&region=eu-west-1") as table:
        print(table.stats().by_state[State.BLOCKED])
        for key in table.unlock_stale(dry_run=True):
            print(key)

A URL says ``layout=powertools`` and, where the persistence layer was built with other
names, Powertools' own constructor arguments (``key_attr``, ``sort_key_attr``,
``static_pk_value``, ``expiry_attr``, ``in_progress_expiry_attr``, ``status_attr``,
``data_attr``, ``validation_key_attr``). idemctl's own protocol (claim, complete, consume)
does not run on this layout: ``idemctl.stores.open_store`` refuses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemctl.errors import ConfigError, MissingDriver
from idemctl.powertools.keys import powertools_key
from idemctl.powertools.model import (
    Layout,
    PowertoolsPage,
    PowertoolsRecord,
    PowertoolsStats,
    State,
)
from idemctl.urls import UrlOptions, redact_url, split_url

if TYPE_CHECKING:
    from idemctl.powertools.table import PowertoolsTable

LAYOUT = "powertools"

__all__ = [
    "Layout",
    "PowertoolsPage",
    "PowertoolsRecord",
    "PowertoolsStats",
    "State",
    "is_powertools",
    "open_table",
    "powertools_key",
]


def is_powertools(url: str) -> bool:
    """Whether ``url`` asks for Powertools' layout (``layout=powertools``)."""
    from idemctl.backends import layout_of

    return layout_of(url) == LAYOUT


def open_table(url: str) -> PowertoolsTable:
    """The Powertools table at ``url``: ``dynamodb://TABLE?layout=powertools&...`` or
    ``redis://HOST:PORT/DB?layout=powertools&...`` (``rediss://``, ``redis+cluster://``)."""
    parts = split_url(url)
    if parts.fragment:
        raise ConfigError(
            f"{redact_url(url)}: a '#' starts the URL's fragment; write it %23 "
            "(static_pk_value=idempotency%23my-function)"
        )
    options = UrlOptions(url)
    if (options.text("layout") or "").lower() != LAYOUT:
        raise ConfigError(f"{redact_url(url)} does not say layout=powertools")
    layout = Layout(**{n: v for n in Layout.names() if (v := options.text(n)) is not None})
    if layout.sort_key_attr == layout.key_attr:
        raise ConfigError(
            f"{redact_url(url)}: key_attr and sort_key_attr cannot both be "
            f"{layout.key_attr!r} (Powertools refuses that too)"
        )
    scheme = parts.scheme.lower()
    from idemctl import backends

    try:
        backend = backends.for_url(url)
        table_class = backend.load_layout(LAYOUT)
    except (ConfigError, KeyError):
        names = sorted(b.name for b in backends.families() if LAYOUT in b.layouts)
        raise ConfigError(
            f"layout=powertools is for {' and '.join(f'{n}://' for n in names)} URLs, not "
            f"{scheme}:// ({redact_url(url)})"
        ) from None
    except MissingDriver as exc:
        raise MissingDriver(
            f"Powertools tables on {scheme}:// need the {backend.extra} extra: "
            f"pip install 'idemctl[{backend.extra}]'"
        ) from exc
    table: PowertoolsTable = table_class.from_url(url, options, layout)
    return table
