"""Powertools idempotency records on Redis (``RedisCachePersistenceLayer``'s layout): each
record a string key (the idempotency key itself, no prefix) holding a JSON object, with a
Redis TTL at ``expiration``. Powertools also leaves ``KEY:lock`` helper keys (``SET NX EX``)
when it takes over a record: idemctl never lists, counts or deletes them.

Powertools keeps no index, so listing is a SCAN (``MATCH PREFIX*`` with ``--prefix``: give
the function's key prefix to read only its records). Each delete is one Lua script that
reads the record, checks the rule and deletes it, atomically."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from idemctl.errors import ConfigError
from idemctl.model import Finding
from idemctl.powertools.model import Layout, PowertoolsRecord, in_ms, not_a_record, record_from
from idemctl.powertools.table import Delete, PowertoolsTable, Rule, records_findings
from idemctl.stores.redis.connect import connect, target
from idemctl.stores.redis.errors import translate
from idemctl.urls import UrlOptions, redact_url

LOCK_SUFFIX = ":lock"
SCAN_COUNT = 1000
BATCH = 500

# KEYS[1] the record; ARGV: rule, now (s), cutoff (ms for unlock, s for purge), the
# status, expiry and in-progress expiry attributes' names, then the names of every other
# attribute Powertools writes. Returns {deleted, the value}. Only a Powertools record is
# ever deleted: a JSON object of Powertools' attributes, its status INPROGRESS or
# COMPLETED, its expiries numbers.
_DELETE = """
local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' then return {0, false} end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then return {0, raw} end
local known = {}
for i = 4, #ARGV do known[ARGV[i]] = true end
for name in pairs(rec) do
  if not known[name] then return {0, raw} end
end
local rule, now, cut = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local st, exp, ipe = rec[ARGV[4]], rec[ARGV[5]], rec[ARGV[6]]
if st ~= 'INPROGRESS' and st ~= 'COMPLETED' then return {0, raw} end
if type(exp) ~= 'number' then return {0, raw} end
if ipe ~= nil and ipe ~= cjson.null and type(ipe) ~= 'number' then return {0, raw} end
if type(ipe) ~= 'number' then ipe = nil end
local expired = exp < now
local go = false
if rule == 'unlock' then go = st == 'INPROGRESS' and ((ipe ~= nil and ipe < cut) or expired)
elseif rule == 'unlock_force' then go = st == 'INPROGRESS'
elseif rule == 'forget' then go = st == 'COMPLETED' or expired
elseif rule == 'forget_force' then go = true
elseif rule == 'purge' then go = exp < cut
end
if go then redis.call('DEL', KEYS[1]); return {1, raw} end
return {0, raw}
"""


class RedisPowertoolsTable(PowertoolsTable):
    def __init__(self, client: Any, layout: Layout, url: str) -> None:
        """``client``: redis-py's, plain or cluster (both have what is used here)."""
        self.client = client
        self.layout = layout
        self.url = redact_url(url)
        self._script = client.register_script(_DELETE)

    @classmethod
    def from_url(cls, url: str, options: UrlOptions, layout: Layout) -> RedisPowertoolsTable:
        if layout.sort_key_attr or layout.static_pk_value or layout.key_attr != Layout.key_attr:
            raise ConfigError(
                f"{redact_url(url)}: Powertools' Redis layer has no key attributes "
                "(key_attr, sort_key_attr, static_pk_value are DynamoDB's)"
            )
        return cls(connect(url, target(url, options)), layout, url)

    def close(self) -> None:
        self.client.close()

    def _do(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc

    def _record(self, key: str, raw: Any) -> PowertoolsRecord:
        """The record ``raw`` holds: one whose ``problems`` say what it is where it is no
        Powertools record."""
        if isinstance(raw, Exception):
            return not_a_record(key, "not a string value")
        try:
            values = json.loads(raw)
        except ValueError:
            return not_a_record(key, "not JSON")
        if not isinstance(values, dict):
            return not_a_record(key, "not a JSON object")
        return record_from(key, values, self.layout)

    # The backend's part --------------------------------------------------------------------

    def _read(self, key: str) -> PowertoolsRecord | None:
        try:
            raw = self._do(self.client.get, key)
        except Exception as exc:  # a key of another type: no Powertools record
            if isinstance(exc.__cause__, ResponseError) and "WRONGTYPE" in str(exc.__cause__):
                return not_a_record(key, "not a string value")
            raise
        return None if raw is None else self._record(key, raw)

    def _items(
        self, prefix: str | None, limit: int | None = None
    ) -> Iterator[list[PowertoolsRecord]]:
        pattern = _escaped(prefix or "") + "*"
        keys: list[str] = []
        scanned = self._do(self.client.scan_iter, match=pattern, count=SCAN_COUNT)
        for seen, key in enumerate(scanned, 1):
            keys.append(key)
            if len(keys) >= BATCH or seen == limit:
                yield self._batch(keys)
                keys = []
                if seen == limit:
                    return
        if keys:
            yield self._batch(keys)

    def _batch(self, keys: list[str]) -> list[PowertoolsRecord]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        values = self._do(pipe.execute, raise_on_error=False)
        return [
            self._record(key, raw)
            for key, raw in zip(keys, values, strict=True)
            # Powertools' helper: neither a record nor another application's
            if not (key.endswith(LOCK_SUFFIX) and raw == "True")
        ]

    def _delete(self, d: Delete) -> tuple[bool, PowertoolsRecord | None]:
        lay = self.layout
        cutoff = in_ms(d.cutoff) if d.rule is Rule.UNLOCK else int(d.cutoff.timestamp())
        args = [
            d.rule.value,
            int(d.now.timestamp()),
            cutoff,
            lay.status_attr,
            lay.expiry_attr,
            lay.in_progress_expiry_attr,
            lay.data_attr,
            lay.validation_key_attr,
        ]
        deleted, raw = self._do(self._script, keys=[d.key], args=args)
        if raw is None:
            return False, None
        return bool(deleted), self._record(d.key, raw)

    def check(self) -> list[Finding]:
        self._do(self.client.ping)
        findings = [Finding("connection", True, f"{self.url} answers")]
        try:
            policy = self._do(self.client.config_get, "maxmemory-policy")
        except Exception:  # CONFIG is renamed or refused on many managed servers
            policy = {}
        if isinstance(policy, dict) and policy:
            value = str(next(iter(policy.values())))
            evicts = value != "noeviction"
            findings.append(
                Finding(
                    "eviction",
                    True,
                    f"maxmemory-policy {value}"
                    + (
                        ": a record evicted under memory pressure lets its payload run again"
                        if evicts
                        else ""
                    ),
                    "CONFIG SET maxmemory-policy noeviction (and size maxmemory for the "
                    "records' expiration)"
                    if evicts
                    else None,
                    warning=evicts,
                )
            )
        return findings + records_findings(self)


def _escaped(text: str) -> str:
    """``text`` matched literally by a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
