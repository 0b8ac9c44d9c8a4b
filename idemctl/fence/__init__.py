"""Fenced effects: the fencing token enforced where the effect lands.

idemctl runs a key to completion once; an effect outside the store can still repeat when an
attempt dies (or stalls past its lease) between its effect and its completion. Each takeover
hands the next attempt a larger fencing token (``ctx.fence.token``). A fenced write stamps
the resource with the key and the token it was written under, and refuses a writer whose
token is older than the one the resource last accepted from the same key: the late write of
a zombie attempt raises :class:`~idemctl.errors.StaleFence`, which the runner treats as a
lost key (not retried, not dead-lettered, logged). A newer attempt's write replaces what
the dead one left, so the resource holds one effect per key.

Tokens are counted per key: a resource is fenced by the key that guards it, and two keys'
tokens are never compared (a row last written under another key accepts the write).

    from idemctl.fence.sql import fenced_insert

    def charge(event, ctx):
        fenced_insert(conn, "charges", {"payment": ctx.key, "cents": 100}, ctx.fence,
                      unique=("payment",))
"""

from __future__ import annotations

from dataclasses import dataclass

from idemctl.errors import IdemctlError

__all__ = ["Fence", "FenceConflict"]


class FenceConflict(IdemctlError):
    """A fenced insert found the row written under another key: two keys claim one row."""


@dataclass(frozen=True, slots=True)
class Fence:
    """What a fenced write needs of the attempt making it: ``ctx.fence``."""

    key: str
    """The idempotency key the attempt holds: the resource's fence is kept per key."""
    token: int
    """The attempt's fencing token: larger on every takeover of ``key``."""

    def resource(self, name: str) -> str:
        """A resource name of this key's own (``"<key>/<name>"``), e.g. for a Redis key
        or an item that only this key writes."""
        return f"{self.key}/{name}"
