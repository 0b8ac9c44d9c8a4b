"""``redis://``, ``rediss://`` (TLS) and ``redis+cluster://``: the fastest store.

Every state change is one Lua script from ``lua/`` over one string per key (the record as
JSON), judged by the server's clock. Keys are ``PREFIX{KEY}``: the hash tag keeps each
record on one slot, so the same scripts run on Redis Cluster. A batch is one script call
(one per slot on a cluster, in one pipelined round trip).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from idemctl.errors import (
    ConfigError,
    InvalidCursor,
    KeyNotFound,
    StoreError,
    StoreUnavailable,
)
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completed,
    Completion,
    Failed,
    Finding,
    Mismatch,
    Page,
    Provisioning,
    Record,
    Stats,
    Status,
    canonical_json,
    validate_key,
)
from idemctl.resources import read_resource
from idemctl.stores.base import (
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    BaseStore,
    Progress,
    Query,
    new_owner,
    scan_query,
    server_clock_finding,
    stats_of,
)
from idemctl.stores.machine import check_forgettable, lease_lost, live_lease, not_unlockable

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis comes with idemctl[redis]
    _pack = None

SCRIPT_NAMES = ("claim", "complete", "fail", "extend", "release", "unlock", "forget", "purge")
SCAN_COUNT = 500
MAX_CALL_KEYS = 500
"""Keys per script call on one server: Redis runs nothing else while a script runs."""
# redis-py options a URL may carry through to the client.
_CLIENT_DURATIONS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")
_CLIENT_TEXTS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "client_name")


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


LIB = read_resource("lua", "_lib.lua")


def load_scripts() -> dict[str, Script]:
    """The scripts as sent to the server: ``_lib.lua`` followed by the script's own file."""
    scripts = {}
    for name in SCRIPT_NAMES:
        source = LIB + "\n" + read_resource("lua", f"{name}.lua")
        sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts so
        scripts[name] = Script(name, source, sha)
    return scripts


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _ms(value: str | int, _at: Any = datetime.fromtimestamp) -> datetime | None:
    return _at(int(value) / 1000, UTC) if value else None


def _server_time(seconds: Any, micros: Any) -> datetime:
    """A TIME reply as a datetime."""
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, UTC)


def _fields(text: str | bytes | None) -> dict[str, str] | None:
    """A record's fields from its JSON text (see lua/_lib.lua), or None when there is none or
    the key holds something else: a key of another program under the prefix is not ours."""
    if text is None:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) and fields.get("status") else None


def _parse(reply: Sequence[Any]) -> tuple[str, dict[str, str] | None]:
    """A script's reply: its code, and the record's fields (None when there is no record)."""
    return _text(reply[0]), (json.loads(reply[1]) if len(reply) > 1 else None)


def _record(key: str, f: dict[str, str]) -> Record:
    get = f.get
    created = _ms(f["created"])
    assert created is not None
    result = get("result")
    return Record(
        key=key,
        status=Status(f["status"]),
        fingerprint=get("fp") or None,
        owner=get("owner") or None,
        fencing_token=int(f["token"]),
        attempts=int(f["attempts"]),
        lease_expires_at=_ms(get("lease", "")),
        created_at=created,
        updated_at=_ms(get("updated", "")) or created,
        completed_at=_ms(get("completed", "")),
        expires_at=_ms(get("expires", "")),
        result=json.loads(result) if result else None,
        error=get("error") or None,
        retriable=get("retriable") == "1",
    )


class _Connections:
    """The script calls' own connections to one server, outside redis-py's pool.

    redis-py's client takes a connection from its pool around every command and polls its
    socket for a stale reply before each use: on a small machine that is a third of a
    script call's client time. Here a caller pops a connection off a free list and puts it
    back; one whose command did not finish (a network error, a timeout, an interrupt) is
    disconnected instead of polled, so it can never hold a stale reply, and reconnects on
    its next use. The pool's settings (address, TLS, timeouts, retry) make every connection.
    """

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._pid = os.getpid()
        self._free: list[Any] = []
        self._all: list[Any] = []

    def execute(self, args: tuple[Any, ...]) -> Any:
        if self._pid != os.getpid():  # a forked child must not share its parent's sockets
            self._pid, self._free, self._all = os.getpid(), [], []
        try:
            conn = self._free.pop()
        except IndexError:
            conn = self._pool.make_connection()
            self._all.append(conn)
        try:
            return conn.retry.call_with_retry(
                lambda: _send(conn, args), lambda _error: conn.disconnect()
            )
        except ResponseError:
            raise  # a whole error reply was read: the connection is fine
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._free.append(conn)

    def close(self) -> None:
        for conn in self._all:
            conn.disconnect()
        self._free.clear()
        self._all.clear()


def _send(conn: Any, args: tuple[Any, ...]) -> Any:
    # hiredis packs str, bytes and numbers as they are; redis-py's packer first copies
    # every argument through a generator.
    conn.send_packed_command([_pack(args)] if _pack is not None else conn.pack_command(*args))
    return conn.read_response()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisStore(BaseStore):
    scheme = "redis"

    def __init__(
        self,
        client: Any,
        *,
        url: str,
        prefix: str = "idem:",
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        durable: bool = False,
        replicas: int = 0,
        durable_timeout: float = 1.0,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        self._client = client
        self.prefix = prefix
        self.cluster = isinstance(client, RedisCluster)
        self._direct = None if self.cluster else _Connections(client.connection_pool)
        if durable and self.cluster:
            raise ConfigError(
                "durable=1 is not available on redis+cluster: WAIT only covers writes sent on "
                "its own connection, which a cluster client does not guarantee"
            )
        self.durable = durable
        self.replicas = replicas
        self.durable_timeout = durable_timeout
        self._waitaof: bool | None = None  # whether the server has WAITAOF, found on first use
        self.scripts = load_scripts()

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        from idemctl.urls import UrlOptions, redact_url

        options = UrlOptions(url)
        parts = options.parts
        cluster = parts.scheme == "redis+cluster"
        settings: dict[str, Any] = {
            "prefix": options.text("prefix", "idem:"),
            "lease": options.duration("lease", DEFAULT_LEASE),
            "retention": options.duration("retention", DEFAULT_RETENTION),
            "durable": options.flag("durable", False),
            "durable_timeout": options.duration("durable_timeout", 1.0),
        }
        settings["replicas"] = options.whole("replicas", 0)
        client_options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        for name in _CLIENT_DURATIONS:
            client_options[name] = options.duration(name, client_options.get(name, 0.0))
        for name in _CLIENT_TEXTS:
            value = options.text(name)
            if value is not None:
                client_options[name] = value
        options.finish()
        if not parts.hostname:
            raise ConfigError(f"Redis URL {redact_url(url)} names no host")
        # A few quick retries ride out a reconnect; a dead server is reported in about a second,
        # a closed port or refused credentials at once.
        retry = _Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
        plain = urlunsplit(parts._replace(scheme="redis" if cluster else parts.scheme, query=""))
        try:
            if cluster:
                client: Any = RedisCluster.from_url(
                    plain, decode_responses=True, retry=retry, **client_options
                )
            else:
                client = redis.Redis.from_url(
                    plain, decode_responses=True, retry=retry, **client_options
                )
        except (RedisClusterException, RedisError) as exc:
            raise _translate(exc, redact_url(url)) from exc
        return cls(client, url=url, **settings)

    # Plumbing ---------------------------------------------------------------------------------

    def _rkey(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}"

    def _key_of(self, rkey: str) -> str:
        return rkey[len(self.prefix) + 1 : -1]

    def _guard(self) -> AbstractContextManager[None]:
        return _guard(self.url)

    def _load(self) -> None:
        for script in self.scripts.values():
            if self._direct is not None:  # on the connection the scripts then run on
                self._direct.execute(("SCRIPT", "LOAD", script.source))
            else:
                self._client.script_load(script.source)

    def _groups(self, keys: Sequence[str]) -> list[list[int]]:
        """Which items go in one script call: a script may only touch keys of one slot on a
        cluster; on one server, any keys, in chunks that keep each call short."""
        if self.cluster:
            by_slot: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                by_slot.setdefault(self._client.keyslot(self._rkey(key)), []).append(i)
            return list(by_slot.values())
        return [
            list(range(i, min(i + MAX_CALL_KEYS, len(keys))))
            for i in range(0, len(keys), MAX_CALL_KEYS)
        ]

    def _call(
        self,
        name: str,
        shared: Sequence[Any],
        items: Sequence[tuple[str, Sequence[Any]]],
        durable: bool = False,
    ) -> list[Any]:
        """Run script ``name`` over ``items`` (key, per-key values): one reply per item.

        On one server, a plain EVALSHA over the store's own connections (see _Connections).
        Otherwise one EVALSHA per group of keys (see _groups), all in one pipelined round trip
        (one per node on a cluster), followed by what confirms them under durable=1.
        Every script is safe to repeat with the same arguments, so the calls a server that
        lost its scripts refused are simply sent again after loading them."""
        sha = self.scripts[name].sha
        confirm = durable and self.durable
        try:
            if self._direct is not None and not confirm and len(items) <= MAX_CALL_KEYS:
                command = ("EVALSHA", *self._evalsha_args(sha, shared, items, range(len(items))))
                for _ in range(2):
                    try:
                        return list(self._direct.execute(command))
                    except NoScriptError:
                        self._load()
            else:
                return self._pipelined(sha, shared, items, confirm)
        except (RedisError, RedisClusterException) as exc:
            raise _translate(exc, self.url) from exc
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def _pipelined(
        self, sha: str, shared: Sequence[Any], items: Sequence[tuple[str, Sequence[Any]]],
        confirm: bool,
    ) -> list[Any]:  # fmt: skip
        calls = [
            (group, self._evalsha_args(sha, shared, items, group))
            for group in self._groups([key for key, _ in items])
        ]
        replies: list[Any] = [None] * len(items)
        for _ in range(2):
            pipe = self._client.pipeline(transaction=False)
            for _, command in calls:
                # The cluster pipeline refuses .evalsha() by name, but routes the
                # command by its first key like any other.
                pipe.execute_command("EVALSHA", *command)
            confirmations = self._add_confirmation(pipe) if confirm else 0
            results = pipe.execute(raise_on_error=False)
            if confirmations:
                self._check_confirmation(results[-confirmations:])
                del results[-confirmations:]
            lost = []
            for (group, command), result in zip(calls, results, strict=True):
                if isinstance(result, NoScriptError):
                    lost.append((group, command))
                elif isinstance(result, Exception):
                    raise result
                else:
                    for i, reply in zip(group, result, strict=True):
                        replies[i] = reply
            if not lost:
                return replies
            self._load()
            calls = lost
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def _evalsha_args(
        self, sha: str, shared: Sequence[Any], items: Sequence[tuple[str, Sequence[Any]]],
        group: Sequence[int],
    ) -> list[Any]:  # fmt: skip
        """EVALSHA's arguments for the items at ``group``: the keys, the shared values, then
        each key's own values in key order (as lua/_lib.lua's each() reads them)."""
        args: list[Any] = [sha, len(group), *(self._rkey(items[i][0]) for i in group), *shared]
        for i in group:
            args += items[i][1]
        return args

    def _one(
        self, name: str, shared: Sequence[Any], key: str, *args: Any, durable: bool = False
    ) -> Any:
        return self._call(name, shared, [(key, args)], durable)[0]

    def _add_confirmation(self, pipe: Any) -> int:
        """Queue what confirms the writes before it on this connection; returns how many replies.

        WAITAOF where the server has it (7.2+). Older servers have only WAIT, for replicas;
        that the write reached their own disk is read from their fsync settings, in the same
        round trip every time, since CONFIG SET can change them at any moment."""
        timeout_ms = int(self.durable_timeout * 1000)
        if self._waitaof is None:
            version = str(self._client.info("server").get("redis_version", "0"))
            self._waitaof = tuple(int(p) for p in version.split(".")[:2]) >= (7, 2)
            if not self._waitaof:  # refuse a server that cannot confirm before writing to it
                self._check_fsync(self._client.config_get("append*"))
        if self._waitaof:
            pipe.execute_command("WAITAOF", 1, self.replicas, timeout_ms)
            return 1
        pipe.config_get("append*")
        pipe.execute_command("WAIT", self.replicas, timeout_ms)
        return 2

    def _check_fsync(self, config: dict[str, str]) -> None:
        if config.get("appendonly") != "yes" or config.get("appendfsync") != "always":
            raise StoreError(
                f"durable=1: Redis at {self.url} cannot confirm writes reach its disk: it has "
                f"appendonly {config.get('appendonly')} and appendfsync "
                f"{config.get('appendfsync')}, and no WAITAOF (Redis 7.2+); set appendonly yes "
                "and appendfsync always"
            )

    def _check_confirmation(self, replies: list[Any]) -> None:
        failed = [r for r in replies if isinstance(r, Exception)]
        if failed:
            raise StoreError(
                f"durable=1: Redis at {self.url} could not confirm the write: {failed[0]}"
            )
        if self._waitaof:
            local, replicas = (int(x) for x in replies[0])
            if local < 1 or replicas < self.replicas:
                raise StoreError(
                    f"durable=1: Redis at {self.url} confirmed the write on {local} local AOF and "
                    f"{replicas} of {self.replicas} replicas within {self.durable_timeout:g}s"
                )
            return
        config, acked = replies
        self._check_fsync(config)
        if int(acked) < self.replicas:
            raise StoreError(
                f"durable=1: only {int(acked)} of {self.replicas} replicas confirmed the write "
                f"within {self.durable_timeout:g}s"
            )

    def _ms(self, seconds: float) -> int:
        return max(1, round(seconds * 1000))

    # The protocol ----------------------------------------------------------------------------

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        owners = [new_owner() for _ in requests]
        shared = (self._ms(self._lease(lease)), self._ms(self.default_retention))
        items = [(r.key, (r.fingerprint or "", o)) for r, o in zip(requests, owners, strict=True)]
        replies = self._call("claim", shared, items, durable=True)
        return [_outcome(*x) for x in zip(requests, owners, replies, strict=True)]

    def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record:
        keep = self._ms(self._retention(retention))
        text = canonical_json(result)
        reply = self._one("complete", (keep, "1"), key, owner, fencing_token, text, durable=True)
        if _text(reply[0]) != "done":
            return self._held(key, owner, fencing_token, reply)
        # This call completed it: the script sent only what the call does not know.
        created, attempts, fp, now = (_text(x) for x in reply[1:])
        at = _ms(now)
        assert at is not None
        return Record(
            key=key, status=Status.COMPLETED, fingerprint=fp or None, owner=None,
            fencing_token=fencing_token, attempts=int(attempts), created_at=_ms(created) or at,
            updated_at=at, completed_at=at, expires_at=_ms(int(now) + keep),
            result=json.loads(text),
        )  # fmt: skip

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        shared = (self._ms(self._retention(retention)), "0")
        items = [(c.key, (c.owner, c.fencing_token, canonical_json(c.result))) for c in completions]
        return [_text(r[0]) == "ok" for r in self._call("complete", shared, items, durable=True)]

    def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record:
        shared = (self._ms(self._retention(retention)),)
        args = (owner, fencing_token, error, "1" if retriable else "0")
        return self._held(
            key, owner, fencing_token, self._one("fail", shared, key, *args, durable=True)
        )

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        shared = (self._ms(self._lease(lease)), self._ms(self.default_retention))
        reply = self._one("extend", shared, key, owner, fencing_token)
        expires = self._held(key, owner, fencing_token, reply).lease_expires_at
        assert expires is not None
        return expires

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        reply = self._one("release", (int(not handler_ran),), key, owner, fencing_token)
        return self._held(key, owner, fencing_token, reply)

    def _held(self, key: str, owner: str, fencing_token: int, reply: Sequence[Any]) -> Record:
        code, fields = _parse(reply)
        if fields is not None and code == "ok":
            return _record(key, fields)
        record = None if fields is None else _record(key, fields)
        raise lease_lost(key, owner, fencing_token, record)

    # Admin ----------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        with self._guard():
            if self.cluster:  # a cluster pipeline refuses TIME, which has no key to route by
                text, now = self._client.get(self._rkey(key)), self._now()
            else:  # the record and the server's clock in one round trip
                pipe = self._client.pipeline(transaction=False)
                text, (seconds, micros) = pipe.get(self._rkey(key)).time().execute()
                now = _server_time(seconds, micros)
        fields = _fields(text)
        if fields is None:
            return None
        record = _record(key, fields)
        return None if record.retention_over(now) else record

    def _now(self) -> datetime:
        return _server_time(*self._client.time())

    def _nodes(self) -> list[Any]:
        return list(self._client.get_primaries()) if self.cluster else [None]

    def _scan_batch(self, node: Any, cursor: int, match: str) -> tuple[int, list[Record]]:
        # On a cluster, each primary is scanned through its own connection: the keys it
        # returns live there, so their records are read there in one pipeline too.
        client = self._client if node is None else node.redis_connection
        cursor, rkeys = client.scan(cursor, match=match, count=SCAN_COUNT, _type="string")
        rkeys = [_text(k) for k in rkeys]
        records = []
        if node is None:
            texts = client.mget(rkeys) if rkeys else []
        else:  # a cluster node refuses MGET across slots, even its own
            pipe = client.pipeline(transaction=False)
            for rkey in rkeys:
                pipe.get(rkey)
            texts = pipe.execute()
        for rkey, text in zip(rkeys, texts, strict=True):
            fields = _fields(text)
            if fields is not None:  # gone since SCAN saw it, or not ours
                records.append(_record(self._key_of(rkey), fields))
        return int(cursor), records

    def _iterate(
        self, prefix: str | None = None, start: str | None = None
    ) -> Iterator[tuple[str, list[Record]]]:
        """Every record under ``prefix``, a SCAN batch at a time, with the position
        ("node:cursor") the batch started at."""
        match = _glob_escape(self.prefix) + "{" + _glob_escape(prefix or "") + "*"
        nodes = self._nodes()
        node_index, cursor = (0, 0) if not start else (int(p) for p in start.split(":"))
        with self._guard():
            while node_index < len(nodes):
                at = f"{node_index}:{cursor}"
                cursor, records = self._scan_batch(nodes[node_index], cursor, match)
                if cursor == 0:
                    node_index += 1
                yield at, records

    def _scan_page(
        self,
        status: Status | None,
        stale_only: bool,
        prefix: str | None,
        limit: int,
        cursor: str | None,
        older_than: float,
        released_only: bool,
    ) -> Page:
        """Pages in SCAN order, sorted by key within each SCAN batch. A cursor is the
        position of a batch and the last key taken from it: SCAN cannot stop mid-batch,
        so the next page scans that batch again and goes on after that key. A full page
        gets a cursor only if a record after it matches: SCAN goes on until it finds one
        or ends."""
        with self._guard():
            query = scan_query(self._now(), status, stale_only, older_than, released_only)
        position, after = _parse_cursor(cursor)
        found: list[Record] = []
        for at, records in self._iterate(prefix, position):
            batch = sorted(
                (r for r in records if query.matches(r) and (after is None or r.key > after)),
                key=lambda r: r.key,
            )
            after = None
            if found and len(found) == limit:  # full: the next page starts at the next match
                if batch:
                    return Page(found, f"{at}/")
                continue
            room = limit - len(found)
            if len(batch) > room:
                found += batch[:room]
                return Page(found, f"{at}/{found[-1].key}" if found else at)
            found += batch
        return Page(found, None)

    def stats(self) -> Stats:
        with self._guard():
            now = self._now()
        return stats_of([r for _, records in self._iterate() for r in records], now)

    def unlock(self, key: str, force: bool = False) -> Record:
        validate_key(key)
        code, fields = _parse(self._one("unlock", ("one", "1" if force else "0"), key))
        if fields is None:
            raise KeyNotFound(key)
        record = _record(key, fields)
        if code == "not_in_progress":
            raise not_unlockable(record)
        if code == "live":
            raise live_lease(record)
        return record

    def _batches(self, query: Callable[[datetime], Query]) -> Iterator[list[Record]]:
        """The records matching ``query`` at the server's time, a SCAN batch at a time."""
        with self._guard():
            matching = query(self._now())
        for _, records in self._iterate():
            yield [r for r in records if matching.matches(r)]

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        def stale(now: datetime) -> Query:
            return Query(lease_expired_at=now - timedelta(seconds=older_than), owned=True)

        keys: list[str] = []
        for batch in self._batches(stale):
            if dry_run or not batch:
                keys += [r.key for r in batch]
                continue
            # The script looks at each key again: it may have been claimed meanwhile.
            shared = ("stale", round(older_than * 1000))
            replies = self._call("unlock", shared, [(r.key, ()) for r in batch])
            freed = zip(batch, replies, strict=True)
            keys += [r.key for r, reply in freed if _text(reply[0]) == "ok"]
            if progress is not None:
                progress(len(batch))
        return sorted(keys)

    def forget(self, key: str, force: bool = False) -> Record:
        validate_key(key)
        # The tombstone keeps the fencing counter for a retention, then expires by TTL.
        shared = ("1" if force else "0", self._ms(self.default_retention))
        code, fields = _parse(self._one("forget", shared, key))
        if fields is None:
            raise KeyNotFound(key)
        record = _record(key, fields)
        if code == "in_progress":
            check_forgettable(record, force)
        return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        def over(now: datetime) -> Query:
            return Query(retention_over_at=now - timedelta(seconds=older_than))

        purged = 0
        for batch in self._batches(over):
            if dry_run or not batch:
                purged += len(batch)
                continue
            replies = self._call("purge", (round(older_than * 1000),), [(r.key, ()) for r in batch])
            purged += sum(int(r) for r in replies)
            if progress is not None:
                progress(len(batch))
        return purged

    # Provisioning and health ------------------------------------------------------------------

    def _loaded(self) -> dict[str, bool]:
        names = list(self.scripts)
        with self._guard():
            answers = self._client.script_exists(*(self.scripts[n].sha for n in names))
        if isinstance(answers, dict):  # a cluster answers per primary: loaded means everywhere
            answers = [all(col) for col in zip(*answers.values(), strict=True)]
        return dict(zip(names, (bool(a) for a in answers), strict=True))

    def provision(self, dry_run: bool = False) -> Provisioning:
        missing = [name for name, loaded in self._loaded().items() if not loaded]
        statements = [
            f"SCRIPT LOAD {name}.lua  -- sha1 {self.scripts[name].sha}" for name in missing
        ]
        if not dry_run and missing:
            with self._guard():
                self._load()
        notes = [] if missing else ["all Lua scripts are loaded"]
        return Provisioning(
            statements, changed=bool(missing) and not dry_run, dry_run=dry_run, notes=notes
        )

    def check(self) -> list[Finding]:
        findings: list[Finding] = []
        with self._guard():
            started = time.perf_counter()
            self._client.ping()
            latency = (time.perf_counter() - started) * 1000
            server_now = self._now()
        try:
            with self._guard():
                version = self._client.info("server").get("redis_version", "?")
        except StoreError:  # INFO may be renamed away, or missing from an emulator
            version = "(version unknown)"
        skew = (server_now - datetime.now(UTC)).total_seconds()
        findings.append(
            Finding(
                "connection", True,
                f"Redis {version} at {self.url}, ping {latency:.2f} ms"
                + (", cluster" if self.cluster else ""),
            )
        )  # fmt: skip
        findings.append(server_clock_finding(skew))
        findings += self._config_findings()
        loaded = self._loaded()
        missing = [n for n, ok in loaded.items() if not ok]
        findings.append(  # not loaded yet is no problem: each loads on its first use
            Finding(
                "scripts", True,
                f"not loaded yet: {', '.join(missing)}; each loads on its first use"
                if missing else "all Lua scripts are loaded",
                None if not missing else "'idemctl init' loads them now",
                warning=bool(missing),
            )
        )  # fmt: skip
        return findings

    def _config_findings(self) -> list[Finding]:
        try:
            with self._guard():
                config = self._client.config_get("*")
                replication = self._client.info("replication")
        except StoreError as exc:
            return [Finding("config", False, f"cannot read the server's config: {exc}")]
        if (
            isinstance(config, dict)
            and config
            and all(isinstance(v, dict) for v in config.values())
        ):
            config = next(iter(config.values()))  # one primary speaks for the cluster
        aof = config.get("appendonly")
        fsync = config.get("appendfsync")
        policy = config.get("maxmemory-policy")
        replicas = int(replication.get("connected_slaves", 0))
        return [
            Finding(
                "appendonly", aof == "yes", f"appendonly {aof}",
                None if aof == "yes"
                else "CONFIG SET appendonly yes: without it a restart forgets every key",
            ),
            _fsync_finding(fsync, aof == "yes"),
            Finding(
                "replicas", replicas >= self.replicas, f"{replicas} connected replica(s)",
                None if replicas >= self.replicas
                else f"durable=1 waits for {self.replicas} replica(s)",
            ),
            Finding(
                "maxmemory-policy", policy == "noeviction", f"maxmemory-policy {policy}",
                None if policy == "noeviction"
                else "CONFIG SET maxmemory-policy noeviction: other policies evict "
                "idempotency records under memory pressure, and evicted keys run again",
            ),
        ]  # fmt: skip

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        self._client.close()


def _fsync_finding(fsync: str | None, aof: bool) -> Finding:
    """appendfsync: always is safest; everysec (Redis's default) a trade-off worth knowing,
    not a failure; no leaves fsync to the OS, which may lose many seconds."""
    applies = "" if aof else " (it applies once appendonly is yes)"
    if fsync == "always":
        return Finding("appendfsync", True, f"appendfsync always{applies}")
    if fsync == "everysec":
        return Finding(
            "appendfsync", True, f"appendfsync everysec{applies}",
            "a crash of the server's machine may lose the last second of writes: keys "
            "completed then run again on redelivery. 'CONFIG SET appendfsync always' closes "
            "that window at some cost in write throughput, as does durable=1 in the store URL "
            "(each write waits until the AOF has it on disk: WAITAOF, Redis 7.2+)",
            warning=True,
        )  # fmt: skip
    return Finding(
        "appendfsync", False, f"appendfsync {fsync}{applies}",
        "CONFIG SET appendfsync always (or everysec): with 'no' the OS decides when the "
        "AOF reaches the disk, and a crash may lose many seconds of completions",
    )  # fmt: skip


def _outcome(request: ClaimRequest, owner: str, reply: Sequence[Any]) -> ClaimOutcome:
    code = _text(reply[0])
    if code in ("acquired", "takeover"):
        token, attempts, lease = reply[1:]
        lease_expires_at = _ms(_text(lease))
        assert lease_expires_at is not None
        return Acquired(
            request.key, owner, int(token), int(attempts), lease_expires_at,
            takeover=code == "takeover",
        )  # fmt: skip
    fields = _parse(reply)[1]
    assert fields is not None
    record = _record(request.key, fields)
    if code == "completed":
        return Completed(record)
    if code == "busy":
        return Busy(record)
    if code == "mismatch":
        return Mismatch(record, request.fingerprint)
    if code == "failed":
        return Failed(record)
    raise StoreError(f"claim script answered {code!r}")


class _Retry(Retry):
    """redis-py's retries, except for what another try cannot mend: refused credentials,
    and a connection refused (nothing listens on that port; a restarting server is waited
    for by the caller's own back-off, as any unreachable store is)."""

    def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        def retryable(error: Exception) -> bool:
            return not _final(error) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def _final(error: BaseException) -> bool:
    """True for an error no retry can mend (see _Retry)."""
    if isinstance(error, AuthenticationError):
        return True
    if not isinstance(error, RedisConnectionError):
        return False
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "Connection refused" in str(error)


def _translate(exc: BaseException, url: str) -> StoreError | ConfigError:
    if isinstance(exc, AuthenticationError):
        missing = "" if "***@" in url else " (the URL has no password; the server wants one)"
        return ConfigError(f"Redis at {url} refused the credentials in the URL{missing}: {exc}")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | ClusterDownError) or (
        isinstance(exc, RedisClusterException) and "connect" in str(exc).lower()
    ):
        return StoreUnavailable(f"Redis at {url} is unreachable: {exc}")
    if isinstance(exc, ResponseError) and "NOPERM" in str(exc):
        return ConfigError(f"Redis at {url} denied a command to this user: {exc}")
    return StoreError(f"Redis at {url}: {exc}")


def _parse_cursor(cursor: str | None) -> tuple[str | None, str | None]:
    """A ``scan`` cursor's batch position ("node:cursor") and the last key taken from that
    batch ("node:cursor/" starts the batch afresh)."""
    if cursor is None:
        return None, None
    position, _, after = cursor.partition("/")
    if not re.fullmatch(r"\d+:\d+", position):
        raise InvalidCursor(f"not a cursor of this Redis store: {cursor!r}")
    return position, after or None


@contextmanager
def _guard(url: str) -> Iterator[None]:
    """Turns redis-py's errors into idemctl's, naming the store by its redacted URL."""
    try:
        yield
    except NoScriptError:
        raise
    except (RedisError, RedisClusterException) as exc:
        raise _translate(exc, url) from exc
