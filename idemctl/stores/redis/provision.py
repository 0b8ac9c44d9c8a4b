"""Provisioning a Redis store (loading its scripts) and checking its health: the
connection, the server's clock, and the settings a restart or memory pressure would
lose records under."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from idemctl.errors import StoreError
from idemctl.model import Finding, Provisioning
from idemctl.stores.queries import server_clock_finding
from idemctl.stores.redis.index import RedisIndex


class RedisProvisioning(RedisIndex):
    """provision() and check(): a part of RedisStore."""

    def _loaded(self) -> dict[str, bool]:
        with self._guard():
            return self.script_runner.loaded()

    def provision(self, dry_run: bool = False) -> Provisioning:
        missing = [name for name, loaded in self._loaded().items() if not loaded]
        statements = [
            f"SCRIPT LOAD {name}.lua  -- sha1 {self.scripts[name].sha}" for name in missing
        ]
        ready = self.index_ready() and self.failed_indexed()
        if not ready:
            statements.append(
                f"SCAN {self.prefix}{{* and {self.prefix}entity:{{*, EVALSHA index.lua on each "
                f"batch  -- count the records written before the index, put the failed ones "
                f"in its failed set; SET {self._ready_key()}, {self._ready_key('failed')}"
            )
        notes = [] if missing else ["all Lua scripts are loaded"]
        if not dry_run and missing:
            with self._guard():
                self.script_runner.load()
        if not dry_run and not ready:
            counted = self.build_index()
            notes.append(f"index built: {counted} record(s) written before it counted")
        if ready:
            notes.append("the index is ready")
        return Provisioning(
            statements,
            changed=bool(statements) and not dry_run,
            dry_run=dry_run,
            notes=notes,
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
        detail = f"Redis {version} at {self.url}, ping {latency:.2f} ms"
        findings.append(Finding("connection", True, detail + (", cluster" if self.cluster else "")))
        findings.append(server_clock_finding(skew))
        findings += self._config_findings()
        counted, failed = self.index_ready(), self.failed_indexed()
        findings.append(  # a warning: the commands still work, reading every key
            Finding(
                "index",
                True,
                "ready: stats, the in-progress and failed listings, unlock --stale and purge "
                "read it"
                if counted and failed
                else "built before its failed set: list --status failed reads every key"
                if counted
                else "not built: stats, list --stale and unlock --stale read every key",
                None
                if counted and failed
                else "'idemctl init' counts the records written before it, once",
                warning=not (counted and failed),
            )
        )
        missing = [n for n, ok in self._loaded().items() if not ok]
        findings.append(  # not loaded yet is no problem: each loads on its first use
            Finding(
                "scripts",
                True,
                f"not loaded yet: {', '.join(missing)}; each loads on its first use"
                if missing
                else "all Lua scripts are loaded",
                None if not missing else "'idemctl init' loads them now",
                warning=bool(missing),
            )
        )
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
                "appendonly",
                aof == "yes",
                f"appendonly {aof}",
                None
                if aof == "yes"
                else "CONFIG SET appendonly yes: without it a restart forgets every key",
            ),
            _fsync_finding(fsync, aof == "yes"),
            Finding(
                "replicas",
                replicas >= self.replicas,
                f"{replicas} connected replica(s)",
                None
                if replicas >= self.replicas
                else f"durable=1 waits for {self.replicas} replica(s)",
            ),
            Finding(
                "maxmemory-policy",
                policy == "noeviction",
                f"maxmemory-policy {policy}",
                None
                if policy == "noeviction"
                else "CONFIG SET maxmemory-policy noeviction: other policies evict "
                "idempotency records under memory pressure, and evicted keys run again",
            ),
        ]


def _fsync_finding(fsync: str | None, aof: bool) -> Finding:
    """appendfsync: always is safest; everysec (Redis's default) a trade-off worth knowing,
    not a failure; no leaves fsync to the OS, which may lose many seconds."""
    applies = "" if aof else " (it applies once appendonly is yes)"
    if fsync == "always":
        return Finding("appendfsync", True, f"appendfsync always{applies}")
    if fsync == "everysec":
        return Finding(
            "appendfsync",
            True,
            f"appendfsync everysec{applies}",
            "a crash of the server's machine may lose the last second of writes: keys "
            "completed then run again on redelivery. 'CONFIG SET appendfsync always' closes "
            "that window at some cost in write throughput, as does durable=1 in the store URL "
            "(each write waits until the AOF has it on disk: WAITAOF, Redis 7.2+)",
            warning=True,
        )
    return Finding(
        "appendfsync",
        False,
        f"appendfsync {fsync}{applies}",
        "CONFIG SET appendfsync always (or everysec): with 'no' the OS decides when the "
        "AOF reaches the disk, and a crash may lose many seconds of completions",
    )
