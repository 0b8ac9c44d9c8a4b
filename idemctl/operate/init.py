"""Provisioning a store (``idemctl init``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemctl.model import Provisioning
    from idemctl.stores.base import Store


def init(store: Store, *, dry_run: bool = False) -> Provisioning:
    """Create what ``store`` needs (schema, tables, indexes, a DynamoDB table and its TTL,
    Redis's scripts); safe to run twice. With ``dry_run``: what would run, nothing
    changed."""
    return store.provision(dry_run=dry_run)
