"""What the CLI tests share: the CLI run in-process, its JSON checked against schemas/, and
a store per backend (sqlite, redis, redis-cluster, postgres, dynamodb) of the test's own.

Fixtures defined here are imported by the test modules that use them:

    from tests.cli.helpers import bare_fixture, target_fixture  # noqa: F401
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from idemctl.model import Acquired, Record
from idemctl.stores import open_store
from idemctl.stores.base import Store
from tests.backends import (
    BACKENDS,
    BY_URL,
    KINDS,
    backdate,
    backends,
    expire_hold,
    expire_retention,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
SCHEMA_BASE = "https://idemctl.dev/schemas/"

LEASE = 600.0
"""The lease (and hold) of what a test claims: live for the whole test, however loaded the
machine (a 30 s lease ran out under CI's load, and a "live" key showed as stale)."""
AGO = 1200.0
"""How far back ``Target.backdate`` and ``Target.stale`` set a record's clock by default:
claimed 20 minutes ago, a LEASE then ended 10 minutes ago."""

STORES = BY_URL
COUNTED_BY = {name: KINDS[name].counted_by for name in STORES}
"""What ``stats`` says it counted by on each store, provisioned; DynamoDB's own counts
are approximate, so the tests that compare every count ask it for ``--exact``
(``stats_args``), and check the approximate ones agree where they are exact."""


def stats_args(target: Target, *, as_json: bool = True) -> list[str]:
    """``stats`` (``--json``), and ``--exact`` where the store's own counts are approximate."""
    exact = ["--exact"] if KINDS[target.name].counted_by == "scan" else []
    return ["stats", *(["--json"] if as_json else []), *exact]


def approximate_agrees(target: Target, exact: dict[str, Any]) -> None:
    """On DynamoDB: plain ``stats`` counts the keys in progress as ``--exact`` does, and
    says the rest is approximate."""
    if KINDS[target.name].counted_by != "scan":
        return
    result = on(target.url, "stats", "--json")
    assert result.exit_code == 0, result.stderr
    approximate = json_doc(result, "stats.schema.json")
    assert approximate["counted_by"] == "approximate"
    for name in ("stale", "released", "oldest_in_progress_at"):
        assert approximate[name] == exact[name], name
    assert approximate["by_status"]["in_progress"] == exact["by_status"]["in_progress"]
    assert approximate["by_status"]["completed"] is None
    assert approximate["past_retention"] is None and approximate["entities"] is None
    assert approximate["total"] >= exact["by_status"]["in_progress"]


"""The real stores every command runs on (memory:// lives in one process: each CLI call
would open a new, empty one)."""

# Environment of every in-process run: no store, config or profile leaks in from the
# developer's shell, and a wide terminal so that tables never fold keys.
_ENV: dict[str, str | None] = {
    "IDEMCTL_STORE": None,
    "IDEMCTL_CONFIG": None,
    "IDEMCTL_PROFILE": None,
    "IDEMCTL_LOG_FORMAT": None,
    "COLUMNS": "250",
    "LINES": "50",
    "NO_COLOR": "1",
    "TERM": "dumb",
}


# Running the CLI ---------------------------------------------------------------------


def run(
    args: list[str], *, input: str | None = None, env: dict[str, str | None] | None = None
) -> Result:
    """``idemctl ARGS`` in this process; exceptions the CLI does not handle propagate."""
    from idemctl.cli import app

    return CliRunner().invoke(
        app, args, input=input, env={**_ENV, **(env or {})}, catch_exceptions=False
    )


def on(url: str, *args: str, input: str | None = None) -> Result:
    """``idemctl --store URL ARGS``."""
    return run(["--store", url, *args], input=input)


def json_doc(result: Result, schema: str) -> Any:
    """The one JSON document on stdout, validated against ``schemas/<schema>``."""
    document = json.loads(result.stdout)
    validate(schema, document)
    return document


def json_lines(result: Result, schema: str = "record.schema.json") -> list[Any]:
    """NDJSON on stdout: one document a line, each validated."""
    documents = []
    for line in result.stdout.splitlines():
        assert line.strip(), f"blank line in NDJSON output: {result.stdout!r}"
        document = json.loads(line)
        validate(schema, document)
        documents.append(document)
    return documents


_STORE_LINE = re.compile(r"\Astore: [^\n]* \(from [^\n]*\)\n")


def store_line(url: str, source: str = "--store") -> str:
    """The line every command that opens a store prints first on stderr."""
    return f"store: {url} (from {source})\n"


def messages(result: Result) -> str:
    """stderr without the ``store: URL (from SOURCE)`` line it starts with when the command
    opened a store."""
    return _STORE_LINE.sub("", result.stderr, count=1)


_MORE = re.compile(
    r"showing (\d+); for more: idemctl list (?:--entities )?\.\.\. --cursor (.+)$", re.MULTILINE
)


def next_cursor(result: Result) -> str | None:
    """The cursor ``list`` (or ``list --entities``) printed on stderr for the next page; None
    when it printed none."""
    match = _MORE.search(result.stderr)
    if match is None:
        return None
    cursor = ast.literal_eval(match.group(2).strip())
    assert isinstance(cursor, str)
    return cursor


RECORD_ROWS = (
    "key", "status", "owner", "fencing token", "attempts", "lease", "age", "updated",
    "completed", "retention", "fingerprint", "error", "result",
)  # fmt: skip
ENTITY_ROWS = (
    "entity", "sequence", "applied", "applied by", "holder", "holder token", "hold", "updated",
    "retention",
)  # fmt: skip


def rows(text: str, names: tuple[str, ...] = RECORD_ROWS) -> dict[str, str]:
    """``inspect``'s detail grid as {field: value} (``names``: ENTITY_ROWS for ``inspect
    --entity``); a value's continuation lines (a result printed as indented JSON) are joined
    to it."""
    found: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        name = next(
            (n for n in sorted(names, key=len, reverse=True) if line.startswith(n + "  ")), None
        )
        if name is not None and name not in found:
            found[name] = line[len(name) :].strip()
            last = name
        elif last is not None:
            found[last] += "\n" + line.strip()
    return found


KEY_COLUMNS = ["KEY", "STATUS", "TOKEN", "ATTEMPTS", "LEASE", "AGE"]
ENTITY_COLUMNS = ["ENTITY", "SEQUENCE", "APPLIED AT", "KEY", "HOLDER"]


def table(text: str, columns: list[str] = KEY_COLUMNS) -> dict[str, list[str]]:
    """``list``'s table as {key: [status, token, attempts, lease, age]} (``columns``:
    ENTITY_COLUMNS for ``list --entities``: {entity: [sequence, applied at, key, holder]}).
    Columns are split on runs of two or more spaces, so a status like ``in_progress
    (stale)`` stays whole."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "no table on stdout"
    assert re.split(r"\s{2,}", lines[0].strip()) == columns, lines[0]
    out = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[0] not in out, f"key listed twice: {cells[0]}"
        out[cells[0]] = cells[1:]
    return out


# JSON schemas ------------------------------------------------------------------------


@cache
def _validators() -> dict[str, Any]:
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource

    schemas = {path.name: json.loads(path.read_text()) for path in SCHEMAS.glob("*.schema.json")}
    for name, schema in schemas.items():
        assert schema["$id"] == SCHEMA_BASE + name
        Draft202012Validator.check_schema(schema)
    registry = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in schemas.values()
    )
    return {
        name: Draft202012Validator(schema, registry=registry, format_checker=FormatChecker())
        for name, schema in schemas.items()
    }


def validate(schema: str, document: Any) -> None:
    """Raise if ``document`` does not follow ``schemas/<schema>`` (formats checked too)."""
    _validators()[schema].validate(document)


# Stores ------------------------------------------------------------------------------


@dataclass
class Target:
    """One store of the test's own: its URL for the CLI, and the library on it."""

    name: str
    url: str
    redis_nodes: list[Any] = field(default_factory=list)
    """The Redis servers behind the URL (every primary of a cluster); empty for others."""
    _store: Store | None = None

    def unload_scripts(self) -> None:
        """SCRIPT FLUSH on every Redis node: as a server that never ran idemctl. Harmless to
        other tests: stores load their scripts again when Redis says NOSCRIPT."""
        for node in self.redis_nodes:
            node.cli("SCRIPT", "FLUSH")

    @property
    def store(self) -> Store:
        """The library's store on the same URL (opened once, closed after the test)."""
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # Building state with the library -----------------------------------------------

    def claim(self, key: str, lease: float = LEASE, fingerprint: str | None = None) -> Acquired:
        """``key`` acquired; by default live for the whole test (LEASE)."""
        outcome = self.store.claim(key, fingerprint=fingerprint, lease=lease)
        assert isinstance(outcome, Acquired), outcome
        return outcome

    def stale(self, key: str, fingerprint: str | None = None) -> Acquired:
        """``key`` acquired AGO (20 minutes) back, its LEASE ended 10 minutes ago and nobody
        freed it: stale, with no sleep and whatever the machine's speed."""
        got = self.claim(key, fingerprint=fingerprint)
        self.backdate(key)
        return got

    def backdate(self, key: str, seconds: float = AGO) -> Record:
        """``key``'s record as if made ``seconds`` earlier (tests/backends.py's ``backdate``:
        created, updated, completed and the lease's end move back; retention's end stays)."""
        return backdate(self.store, key, seconds)

    def expire_hold(self, entity: str) -> None:
        """``entity``'s hold as ended a minute ago (tests/backends.py's ``expire_hold``)."""
        expire_hold(self.store, entity)

    def expire_retention(self, name: str, *, entity: bool = False) -> None:
        """The retention of record (or entity) ``name`` as ended a minute ago
        (tests/backends.py's ``expire_retention``)."""
        expire_retention(self.store, name, entity=entity)

    def completed(
        self, key: str, result: Any = None, retention: float | None = None, **claim: Any
    ) -> Record:
        got = self.claim(key, **claim)
        return self.store.complete(key, got.owner, got.fencing_token, result, retention)

    def failed(
        self, key: str, error: str = "boom", retriable: bool = False, **kwargs: Any
    ) -> Record:
        got = self.claim(key)
        return self.store.fail(key, got.owner, got.fencing_token, error, retriable, **kwargs)

    def get(self, key: str) -> Record | None:
        return self.store.get(key)


def make_target(request: pytest.FixtureRequest, name: str, provision: bool = False) -> Target:
    """A store of the test's own on backend ``name`` (tests/backends.py). Not provisioned
    unless ``provision``: a SQLite file that does not exist, a PostgreSQL schema or DynamoDB
    table not created yet (Redis keeps its Lua scripts server-wide: they may be loaded)."""
    backend = BACKENDS[name](request)
    nodes: list[Any] = []
    if name == "redis":
        nodes = [request.getfixturevalue("redis_server")]
    elif name == "redis-cluster":
        nodes = list(request.getfixturevalue("redis_cluster").nodes)
    target = Target(name, backend.url, nodes)
    request.addfinalizer(target.close)
    if provision:
        with open_store(target.url) as store:
            store.provision()
    return target


@pytest.fixture(name="bare", params=STORES)
def bare_fixture(request: pytest.FixtureRequest) -> Target:
    """``make_target`` on each real store."""
    return make_target(request, request.param)


@pytest.fixture(name="unprovisioned", params=backends(lambda k: k.by_url and not k.readable_bare))
def unprovisioned_fixture(request: pytest.FixtureRequest) -> Target:
    """The stores that cannot be read before ``idemctl init``: a missing SQLite file, a
    PostgreSQL schema that does not exist, a DynamoDB table that does not exist."""
    return make_target(request, request.param)


@pytest.fixture(name="target")
def target_fixture(bare: Target) -> Target:
    """``bare``, provisioned as ``idemctl init`` would."""
    with open_store(bare.url) as store:
        store.provision()
    return bare
