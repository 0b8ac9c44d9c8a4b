"""The one table of backends: each URL scheme maps to its family's store, async store,
layouts other than idemctl's own, and ``verify``'s scratch room (which knows how the family
is faulted). A family registers itself in a module of its own here (``sqlite``, ``memory``,
``redis``, ``postgres``, ``dynamodb``); nothing else in idemctl switches on a scheme. Each
part is named ``"module:attribute"`` and imported only when asked for, so a URL's driver is
imported only when a store of its scheme is opened.

A backend outside idemctl joins the same way::

    from idemctl.backends import Backend, register

    register(Backend("mystore", ("mystore",), store="mypackage.store:MyStore"))
"""

from __future__ import annotations

from idemctl.backends import dynamodb, memory, postgres, redis, sqlite
from idemctl.backends.registry import (
    Backend,
    families,
    for_url,
    layout_of,
    named,
    register,
    schemes,
    transactional,
    unregister,
)

__all__ = [
    "Backend",
    "dynamodb",
    "families",
    "for_url",
    "layout_of",
    "memory",
    "named",
    "postgres",
    "redis",
    "register",
    "schemes",
    "sqlite",
    "transactional",
    "unregister",
]  # fmt: skip
