"""The operator's view of Kafka work on idemctl's own store: a consumer group's audit."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from idemctl import backends
from idemctl.errors import ConfigError

if TYPE_CHECKING:
    from idemctl.audit import AuditOptions, AuditProgress, AuditReport
    from idemctl.stores.base import Store


def audit(
    store: Store,
    options: AuditOptions,
    on_progress: Callable[[AuditProgress], None] | None = None,
) -> AuditReport:
    """Judge the messages below a group's committed offsets against ``store``, the store its
    consumers wrote (``idemctl.audit.audit``), once the store is known to answer."""
    from idemctl.audit import audit as run

    if not backends.for_url(store.url).shared:
        raise ConfigError(
            f"audit reads the store the group's consumers wrote, and a {store.url} store "
            "lives in one process: give the URL of the shared store they wrote"
        )
    store.get("idemctl:probe")  # an unreachable or unprovisioned store fails here
    return run(store, options, on_progress=on_progress)
