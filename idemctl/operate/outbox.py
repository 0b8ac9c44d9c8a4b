"""The operator's view of the transactional outbox: its status, a replay of chosen rows,
and the purge of published rows past retention."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemctl.outbox.replay import Replay
    from idemctl.outbox.table import OutboxStatus, Selection
    from idemctl.stores.base import Progress, Store


def outbox_status(store: Store) -> OutboxStatus:
    """Unpublished rows, the oldest one's age and rows failing, per aggregate type."""
    from idemctl.outbox.table import OutboxTable

    return OutboxTable(store).status()


def outbox_replay(
    store: Store,
    selection: Selection,
    *,
    topic_template: str | None = None,
    to_topic: str | None = None,
    batch_size: int = 100,
) -> Replay:
    """The rows ``selection`` picks, ready to be listed, counted and sent again with their
    original ids (``Replay.send``); the outbox table checked first (NotProvisioned)."""
    from idemctl.outbox.relay import DEFAULT_TOPIC_TEMPLATE
    from idemctl.outbox.replay import Replay

    chosen = Replay(
        store,
        selection,
        topic_template=topic_template or DEFAULT_TOPIC_TEMPLATE,
        to_topic=to_topic,
        batch_size=batch_size,
    )
    chosen.table.check()
    return chosen


def outbox_purge(
    store: Store,
    older_than: float,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> int:
    """Delete the published rows published at least ``older_than`` seconds ago (with
    ``dry_run``: count them); unpublished rows are never touched."""
    from idemctl.outbox.table import OutboxTable

    table = OutboxTable(store)
    table.check()
    return table.purge(older_than, dry_run=dry_run, progress=progress)
