"""Wake-ups for waiters (``wait=``) on Redis: the scripts publish a key's name on the index's
channel when nobody holds the key any more (lua/_lib.lua's wake()); one subscription per
store and process hears them, never one per key.

On one server the channel is ``PREFIXidx:live:wake``. On a cluster each hash slot has its
own (``PREFIXidx:live{TAG}:wake``, in the slot of the keys it tells of, as SPUBLISH needs):
the slots of the keys waited for are subscribed to as they come, on a connection to the
slot's primary, one per node."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

if TYPE_CHECKING:
    from redis.client import PubSub

    from idemctl.stores.redis.core import RedisCore
    from idemctl.stores.waiting import Watch

log = logging.getLogger("idemctl.stores")

CONFIRM = 2.0
"""Seconds to wait for the server to confirm a subscription (then: polling only)."""


def channel(store: RedisCore, rkey: str) -> str:
    """The channel the scripts publish ``rkey``'s wake-up on: its index's, plus ':wake'."""
    return store.index_keys(rkey)[0] + ":wake"


class Subscriber:
    """One pub/sub connection (a server, or a cluster node) that feeds ``watch``, with a
    thread of its own reading it. Subscribes with SSUBSCRIBE where the server has it (the
    scripts SPUBLISH there), else SUBSCRIBE."""

    def __init__(self, store: RedisCore, watch: Watch, pubsub: PubSub) -> None:
        self.store, self.watch, self.pubsub = store, watch, pubsub
        self.channels: set[str] = set()
        self._sharded = True
        self._thread: Any = None

    def _heard(self, message: dict[str, Any]) -> None:
        data = message.get("data")
        rkey = data.decode() if isinstance(data, bytes) else str(data)
        self.watch.notify([self.store._key_of(rkey)])

    def subscribe(self, name: str) -> bool:
        """Subscribe to ``name`` and wait for the server's confirmation: messages published
        after this returns True reach the watch."""
        if name in self.channels:
            return True
        kind = "ssubscribe" if self._sharded else "subscribe"
        try:
            try:
                getattr(self.pubsub, kind)(**{name: self._heard})
                confirmed = self._confirmed(kind)
            except ResponseError:  # before Redis 7: no sharded pub/sub (the scripts PUBLISH)
                if not self._sharded:
                    raise
                self._sharded = False
                self.pubsub.subscribe(**{name: self._heard})
                confirmed = self._confirmed("subscribe")
        except RedisError as exc:
            log.debug("cannot subscribe to %s, waiters poll: %s", name, exc)
            return False
        if confirmed:
            self.channels.add(name)
            if self._thread is None:
                self._thread = self.pubsub.run_in_thread(
                    sleep_time=1.0, daemon=True, exception_handler=_pause
                )
        return confirmed

    def _confirmed(self, kind: str) -> bool:
        if self._thread is not None:  # its thread reads the confirmation
            return True
        deadline = time.monotonic() + CONFIRM
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.2)
            if message is not None and message.get("type") == kind:
                return True
        return False

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(2)
        self.pubsub.close()


def _pause(exc: BaseException, pubsub: Any, thread: Any) -> None:
    """The connection failed: the next read reconnects and subscribes again; meanwhile
    the waiters poll."""
    log.debug("wake-up subscription: %s", exc)
    time.sleep(1.0)


def listen(store: RedisCore, watch: Watch) -> Callable[[], None] | None:
    """Start feeding ``watch`` from the scripts' messages; returns what stops it, or None
    when the server does not confirm (the waiters poll)."""
    cluster = store._cluster
    if cluster is None:
        subscriber = Subscriber(store, watch, store._client.pubsub())
        if not subscriber.subscribe(channel(store, store._rkey("_"))):
            subscriber.close()
            return None
        return subscriber.close
    nodes: dict[str, Subscriber] = {}
    lock = threading.Lock()

    def on_key(key: str) -> None:
        """A cluster's slot channel, subscribed to when its first key is waited for."""
        rkey = store._rkey(key)
        name = channel(store, rkey)
        node = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(rkey))
        with lock:
            subscriber = nodes.get(node.name)
            if subscriber is None:
                pubsub = node.redis_connection.pubsub()
                subscriber = nodes[node.name] = Subscriber(store, watch, pubsub)
            subscriber.subscribe(name)

    def stop() -> None:
        with lock:
            for subscriber in nodes.values():
                subscriber.close()
            nodes.clear()

    watch.on_key = on_key
    return stop
