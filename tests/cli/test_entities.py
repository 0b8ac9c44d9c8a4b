"""The operator's view of the sequence guard's entities: ``inspect --entity``, ``list
--entities``, the ``entities`` count of ``stats``, ``forget --entity`` and what ``init
--dry-run`` provisions for the guard, in-process through CliRunner.

State is built with the library (claim a key, ``guard_many`` for its entity, then
``settle_many``). A hold the test needs live lasts 10 minutes (LEASE), however loaded the
machine; one it needs run out, or an entity it needs past retention, is made so, its end
written a minute back into the store (``Target.expire_hold``, ``Target.expire_retention``),
not slept out.

The stores: every real store (tests/cli/helpers.py's STORES), each test on a store of its
own; all of them pass tests/contract/test_guard.py. What only SQLite can show (a database
provisioned before the guard) runs on SQLite alone.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest

from idemctl.cli.exitcodes import ExitCode
from idemctl.model import Acquired, Entity, Guard, Settle, Verdict
from tests.cli.helpers import (  # noqa: F401 - fixtures
    COUNTED_BY,
    ENTITY_COLUMNS,
    ENTITY_ROWS,
    LEASE,
    STORES,
    Target,
    approximate_agrees,
    bare_fixture,
    json_doc,
    json_lines,
    make_target,
    messages,
    next_cursor,
    on,
    rows,
    run,
    stats_args,
    store_line,
    table,
)

GUARDED = STORES
"""The real stores whose sequence guard passes the contract suite (all of them)."""


@pytest.fixture(name="target", params=GUARDED)
def target_fixture(request: pytest.FixtureRequest) -> Target:
    """A provisioned store of the test's own."""
    return make_target(request, request.param, provision=True)


def apply(
    target: Target, entity: str, sequence: int, key: str, retention: float | None = None
) -> Entity:
    """``key``'s event applies ``sequence`` to ``entity``, and its key completes."""
    got = target.claim(key)
    (reply,) = target.store.guard_many([Guard(entity, sequence, key, got.fencing_token)])
    assert reply.verdict is Verdict.GO, reply
    settled = target.store.settle_many(
        [Settle(entity, sequence, key, got.fencing_token)], retention
    )
    assert settled == [True], settled
    target.store.complete(key, got.owner, got.fencing_token, None)
    return entity_of(target, entity)


def hold(target: Target, entity: str, sequence: int, key: str, lease: float = LEASE) -> Acquired:
    """``key``'s attempt holds ``entity`` (its guard said go), for ``lease`` seconds."""
    got = target.claim(key, lease=lease)
    (reply,) = target.store.guard_many([Guard(entity, sequence, key, got.fencing_token)], lease)
    assert reply.verdict is Verdict.GO, reply
    return got


def entity_of(target: Target, entity: str) -> Entity:
    found = target.store.get_entity(entity)
    assert found is not None, entity
    return found


def stamp(moment: datetime | None) -> str:
    assert moment is not None
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def entities_listed(url: str, *args: str) -> list[str]:
    """Entities ``idemctl list --entities --json ARGS`` prints (all: --limit 0)."""
    result = on(url, "list", "--entities", "--json", "--limit", "0", *args)
    assert result.exit_code == 0, result.stderr
    assert next_cursor(result) is None
    return [d["entity"] for d in json_lines(result, "entity.schema.json")]


# inspect --entity ----------------------------------------------------------------------------


@pytest.mark.clock
def test_inspect_entity_shows_every_field(target: Target) -> None:
    applied = apply(target, "acct:1", 10, "e10")
    held = hold(target, "acct:1", 11, "e11")  # applied 10, and 11 in hand
    expired = hold(target, "acct:2", 5, "e5")  # its first event, hold run out
    target.expire_hold("acct:2")

    shown = {}
    for name in ("acct:1", "acct:2"):
        result = on(target.url, "inspect", "--entity", name)
        assert result.exit_code == 0, result.stderr
        assert result.stderr == store_line(target.store.url)
        shown[name] = rows(result.stdout, ENTITY_ROWS)
        assert list(shown[name]) == list(ENTITY_ROWS), result.stdout

    one = shown["acct:1"]
    now1 = entity_of(target, "acct:1")
    assert one["entity"] == "acct:1"
    assert one["sequence"] == "10"
    assert one["applied"].startswith(stamp(applied.applied_at) + " (")
    assert one["applied"].endswith(" ago)")
    assert one["applied by"] == "e10"
    assert one["holder"] == "e11"
    assert one["holder token"] == str(held.fencing_token)
    assert one["hold"].endswith(f" left ({stamp(now1.lock_expires_at)})")
    assert one["updated"].startswith(stamp(now1.updated_at))
    assert one["retention"].startswith(f"until {stamp(now1.expires_at)} (")
    assert one["retention"].endswith(" left)")

    two = shown["acct:2"]
    now2 = entity_of(target, "acct:2")
    assert (two["sequence"], two["applied"], two["applied by"]) == ("-", "-", "-")
    assert (two["holder"], two["holder token"]) == ("e5", str(expired.fencing_token))
    assert two["hold"].startswith("expired ")
    assert two["hold"].endswith(f" ago ({stamp(now2.lock_expires_at)})")

    # Settled: nobody holds it.
    assert target.store.settle_many([Settle("acct:1", 11, "e11", held.fencing_token)]) == [True]
    free = rows(on(target.url, "inspect", "--entity", "acct:1").stdout, ENTITY_ROWS)
    assert (free["sequence"], free["applied by"]) == ("11", "e11")
    assert (free["holder"], free["holder token"], free["hold"]) == ("-", "-", "-")


def test_inspect_entity_json_is_the_entity(target: Target) -> None:
    apply(target, "j:1", 7, "k7")
    hold(target, "j:2", 1, "k1")
    for name in ("j:1", "j:2"):
        entity = entity_of(target, name)
        for args in (
            ["--store", target.url, "--json", "inspect", "--entity", name],
            ["inspect", "--entity", name, "--json", "--store", target.url],
        ):
            result = run(args)
            assert result.exit_code == 0, result.stderr
            assert json_doc(result, "entity.schema.json") == entity.to_json()
            assert result.stdout.count("\n") == 1
            assert result.stderr == store_line(target.store.url)
    document = json_doc(
        on(target.url, "inspect", "--entity", "j:1", "--json"), "entity.schema.json"
    )
    assert (document["entity"], document["sequence"], document["key"]) == ("j:1", 7, "k7")
    assert (document["holder"], document["holder_token"], document["lock_expires_at"]) == (
        None, None, None,
    )  # fmt: skip
    assert document["applied_at"].endswith("Z") and document["expires_at"].endswith("Z")
    held = json_doc(on(target.url, "inspect", "--entity", "j:2", "--json"), "entity.schema.json")
    assert (held["sequence"], held["key"], held["applied_at"], held["holder"]) == (
        None, None, None, "k1",
    )  # fmt: skip


@pytest.mark.clock
def test_inspect_missing_entity_is_exit_5_like_a_missing_key(target: Target) -> None:
    apply(target, "there", 1, "k")
    apply(target, "gone", 1, "g")
    target.expire_retention("gone", entity=True)
    for name in ("not-there", "gone", "k"):  # none, past retention, a key but no entity
        for extra in ([], ["--json"]):
            result = on(target.url, "inspect", "--entity", name, *extra)
            assert result.exit_code == ExitCode.KEY_NOT_FOUND
            assert result.stdout == ""
            assert result.stderr == store_line(target.store.url) + f"error: no entity {name!r}\n"
    # An entity's name is not a key: inspect KEY does not find it.
    as_key = on(target.url, "inspect", "there")
    assert as_key.exit_code == ExitCode.KEY_NOT_FOUND
    assert messages(as_key) == "error: no record for key 'there'\n"


# list --entities -----------------------------------------------------------------------------


@pytest.mark.clock
def test_list_entities(target: Target) -> None:
    a1 = apply(target, "acct:1", 10, "e10")
    a2 = apply(target, "acct:2", 3, "x3")
    held = hold(target, "acct:2", 4, "x4")
    hold(target, "acct:3", 1, "y1")
    target.expire_hold("acct:3")
    apply(target, "other", 1, "o1")
    apply(target, "acct:gone", 1, "g1")
    target.expire_retention("acct:gone", entity=True)

    everything = ["acct:1", "acct:2", "acct:3", "other"]  # past retention left out
    assert entities_listed(target.url) == everything  # in name order
    assert entities_listed(target.url, "--prefix", "acct:") == ["acct:1", "acct:2", "acct:3"]
    assert entities_listed(target.url, "--prefix", "acct:2") == ["acct:2"]

    # The JSON lines are the entities as the store holds them.
    result = on(target.url, "list", "--entities", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == store_line(target.store.url)
    assert json_lines(result, "entity.schema.json") == [
        entity_of(target, name).to_json() for name in everything
    ]

    shown = on(target.url, "list", "--entities")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stderr == store_line(target.store.url)
    cells = table(shown.stdout, ENTITY_COLUMNS)
    assert list(cells) == everything
    assert (cells["acct:1"][0], cells["acct:1"][2], cells["acct:1"][3]) == ("10", "e10", "-")
    assert cells["acct:1"][1].startswith(f"{stamp(a1.applied_at)} (")
    assert cells["acct:1"][1].endswith(" ago)")
    assert cells["acct:2"][0] == "3" and cells["acct:2"][1].startswith(stamp(a2.applied_at))
    assert cells["acct:2"][2] == "x3"
    assert cells["acct:2"][3].startswith("x4 (") and cells["acct:2"][3].endswith(" left)")
    assert cells["acct:3"][:3] == ["-", "-", "-"]
    assert cells["acct:3"][3].startswith("y1 (expired ") and cells["acct:3"][3].endswith(" ago)")
    assert entity_of(target, "acct:2").holder_token == held.fencing_token


def test_list_entities_nothing_matches(target: Target) -> None:
    for args in ([], ["--prefix", "acct:"]):
        result = on(target.url, "list", "--entities", *args)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == ""
        assert messages(result) == "no entities match\n"
    apply(target, "acct:1", 1, "k")
    target.completed("acct:2")  # a key, not an entity
    nothing = on(target.url, "list", "--entities", "--prefix", "acct:2")
    assert (nothing.exit_code, nothing.stdout) == (0, "")
    assert messages(nothing) == "no entities match\n"
    as_json = on(target.url, "list", "--entities", "--json", "--prefix", "zzz")
    assert (as_json.exit_code, as_json.stdout) == (0, "")
    # list without --entities lists keys, never entities.
    keys = on(target.url, "list", "--json")
    assert sorted(d["key"] for d in json_lines(keys)) == ["acct:2", "k"]


def test_list_entities_pages_with_cursor(target: Target) -> None:
    names = [f"p:{n:02d}" for n in range(11)]
    for n, name in enumerate(names):
        apply(target, name, n, f"k{n}")
    apply(target, "q:other", 1, "q")

    def pages(limit: int, *args: str, as_json: bool = True) -> list[list[str]]:
        out, cursor = [], None
        for _ in range(50):
            more = ["--cursor", cursor] if cursor is not None else []
            result = on(
                target.url, "list", "--entities", "--limit", str(limit), *args, *more,
                *(["--json"] if as_json else []),
            )  # fmt: skip
            assert result.exit_code == 0, result.stderr
            if as_json:
                page = [d["entity"] for d in json_lines(result, "entity.schema.json")]
            else:
                page = list(table(result.stdout, ENTITY_COLUMNS))
            out.append(page)
            cursor = next_cursor(result)
            if cursor is None:
                return out
            assert messages(result) == (
                f"showing {len(page)}; for more: idemctl list --entities ... --cursor {cursor!r}\n"
            )
        raise AssertionError(f"list --entities --limit {limit} did not end: {out}")

    for limit, args, as_json, expected in (
        (3, ["--prefix", "p:"], True, names),
        (4, [], True, [*names, "q:other"]),
        (5, ["--prefix", "p:"], False, names),
        (1, ["--prefix", "q:"], True, ["q:other"]),
    ):
        got = pages(limit, *args, as_json=as_json)
        seen = [n for page in got for n in page]
        assert sorted(seen) == expected, got  # every entity, once
        assert all(page == sorted(page) for page in got), got  # in name order within a page
        assert all(0 < len(page) <= limit for page in got), got

    everything = on(target.url, "list", "--entities", "--limit", "0", "--json")
    assert len(json_lines(everything, "entity.schema.json")) == 12
    assert "showing" not in everything.stderr
    default = on(target.url, "list", "--entities", "--json")  # the default limit is 50
    assert len(json_lines(default, "entity.schema.json")) == 12
    assert next_cursor(default) is None
    exact = on(target.url, "list", "--entities", "--limit", "12", "--json")
    assert next_cursor(exact) is None, exact.stderr


def test_list_entities_prefix_is_literal(target: Target) -> None:
    odd = ["o:[bold]x[/bold]", "o:%pct", "o:_under", "o:*star", "o:ünï ✓"]
    for n, name in enumerate(odd):
        apply(target, name, 1, f"k{n}")
    assert entities_listed(target.url, "--prefix", "o:") == sorted(odd)
    for prefix, expected in (
        ("o:[", ["o:[bold]x[/bold]"]), ("o:%", ["o:%pct"]), ("o:_", ["o:_under"]),
        ("o:*", ["o:*star"]), ("o:?", []),
    ):  # fmt: skip
        assert entities_listed(target.url, "--prefix", prefix) == expected, prefix
    shown = table(on(target.url, "list", "--entities", "--prefix", "o:").stdout, ENTITY_COLUMNS)
    assert sorted(shown) == sorted(odd)
    detail = rows(on(target.url, "inspect", "--entity", "o:[bold]x[/bold]").stdout, ENTITY_ROWS)
    assert detail["entity"] == "o:[bold]x[/bold]"


# stats -----------------------------------------------------------------------------------------


@pytest.mark.clock
def test_stats_counts_entities(target: Target) -> None:
    empty = on(target.url, *stats_args(target))
    assert empty.exit_code == 0, empty.stderr
    assert json_doc(empty, "stats.schema.json")["entities"] == 0
    none_yet = grid(on(target.url, *stats_args(target, as_json=False)).stdout)
    assert none_yet["entities"] == ["0"]

    apply(target, "acct:1", 1, "a1")
    apply(target, "acct:2", 1, "a2")
    hold(target, "acct:3", 1, "a3")
    apply(target, "acct:gone", 1, "g")
    target.expire_retention("acct:gone", entity=True)  # a minute ago: its second is over

    result = on(target.url, *stats_args(target))
    assert result.exit_code == 0, result.stderr
    document = json_doc(result, "stats.schema.json")
    assert document == {
        "store": target.store.url, "store_source": "--store", "total": 4,
        "by_status": {"in_progress": 1, "completed": 3, "failed": 0}, "stale": 0,
        "released": 0, "oldest_in_progress_at": document["oldest_in_progress_at"],
        "oldest_in_progress_age_seconds": document["oldest_in_progress_age_seconds"],
        "past_retention": 0, "entities": 3, "counted_by": COUNTED_BY[target.name],
    }  # fmt: skip
    cells = grid(on(target.url, *stats_args(target, as_json=False)).stdout)
    assert cells["entities"] == ["3", "last applied sequence per entity: idemctl list --entities"]
    assert cells["total"] == ["4"]  # keys; entities are counted apart

    assert on(target.url, "forget", "--entity", "acct:1").exit_code == 0
    assert json_doc(on(target.url, *stats_args(target)), "stats.schema.json")["entities"] == 2


def test_stats_on_a_store_provisioned_before_the_guard(tmp_path: Path) -> None:
    """A SQLite database at schema version 1 (no idem_entities): stats still counts keys,
    and says the guard's table is missing; init adds it."""
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    assert on(url, "init").exit_code == 0
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE idem_entities")
        conn.execute("UPDATE idem_meta SET value = '1' WHERE name = 'schema_version'")
    conn.close()

    result = on(url, "stats", "--json")
    assert result.exit_code == 0, result.stderr
    document = json_doc(result, "stats.schema.json")
    assert (document["total"], document["entities"]) == (0, None)
    shown = on(url, "stats")
    assert shown.exit_code == 0, shown.stderr
    assert grid(shown.stdout)["entities"] == ["-", "no sequence guard table yet: idemctl init"]
    listed = on(url, "list", "--entities")
    assert listed.exit_code == ExitCode.NOT_PROVISIONED, listed.stdout + listed.stderr
    assert "idemctl init" in messages(listed)

    dry = on(url, "init", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "CREATE TABLE IF NOT EXISTS idem_entities" in dry.stdout
    assert on(url, "init").exit_code == 0
    assert json_doc(on(url, "stats", "--json"), "stats.schema.json")["entities"] == 0


def grid(text: str) -> dict[str, list[str]]:
    """``stats``' grid as {first cell: the other cells}."""
    out = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0]:
            out[cells[0]] = cells[1:]
    return out


# forget --entity -------------------------------------------------------------------------------


def test_forget_entity(target: Target) -> None:
    apply(target, "acct:1", 10, "e10")
    before = entity_of(target, "acct:1")

    done = on(target.url, "forget", "--entity", "acct:1")  # one entity: no question asked
    assert done.exit_code == 0, done.stdout + done.stderr
    assert done.stdout == (
        "forgot entity 'acct:1' (at sequence 10, applied by key 'e10'): "
        "its next event applies whatever its sequence\n"
    )
    assert done.stderr == store_line(target.store.url)
    assert target.store.get_entity("acct:1") is None
    # Forgotten, an older sequence applies again; the key that applied 10 is untouched.
    assert target.get("e10") is not None
    again = apply(target, "acct:1", 3, "e3")
    assert (again.sequence, again.key) == (3, "e3")

    as_json = on(target.url, "forget", "--entity", "acct:1", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    assert json_doc(as_json, "action.schema.json") == {
        "action": "forget", "store": target.store.url, "store_source": "--store",
        "dry_run": False, "count": 1, "keys": None, "record": None,
        "entity": again.to_json(),
    }  # fmt: skip
    assert target.store.get_entity("acct:1") is None
    assert before.sequence == 10

    missing = on(target.url, "forget", "--entity", "acct:1")
    assert missing.exit_code == ExitCode.KEY_NOT_FOUND  # as a missing key
    assert missing.stdout == ""
    assert messages(missing) == "error: no entity 'acct:1'\n"


@pytest.mark.clock
def test_forget_held_entity_is_refused_without_force(target: Target) -> None:
    apply(target, "acct:1", 10, "e10")
    held = hold(target, "acct:1", 11, "e11")
    before = entity_of(target, "acct:1")

    refused = on(target.url, "forget", "--entity", "acct:1")
    assert refused.exit_code == ExitCode.REFUSED  # as forgetting an in-progress key
    assert refused.stdout == ""
    said = messages(refused)
    assert said.startswith("error: entity 'acct:1' is held by key 'e11' until ")
    assert "--force" in said and len(said.splitlines()) == 1
    assert entity_of(target, "acct:1") == before  # untouched

    forced = on(target.url, "forget", "--entity", "acct:1", "--force")
    assert forced.exit_code == 0, forced.stdout + forced.stderr
    assert forced.stdout == (
        "forgot entity 'acct:1' (at sequence 10, applied by key 'e10'; held by key 'e11'): "
        "its next event applies whatever its sequence\n"
    )
    assert target.store.get_entity("acct:1") is None
    # The attempt that held it can no longer settle.
    assert target.store.settle_many([Settle("acct:1", 11, "e11", held.fencing_token)]) == [False]

    # A hold that ran out needs no --force.
    hold(target, "acct:2", 1, "x1")
    target.expire_hold("acct:2")
    expired = on(target.url, "forget", "--entity", "acct:2")
    assert expired.exit_code == 0, expired.stdout + expired.stderr
    assert expired.stdout == (
        "forgot entity 'acct:2' (no sequence applied yet; held by key 'x1'): "
        "its next event applies whatever its sequence\n"
    )


def test_forget_entity_dry_run_changes_nothing(target: Target) -> None:
    apply(target, "d:done", 4, "k4")
    hold(target, "d:held", 1, "k1")
    names = ("d:done", "d:held")
    before = {n: entity_of(target, n) for n in names}

    dry = on(target.url, "forget", "--entity", "d:done", "--dry-run")
    assert dry.exit_code == 0, dry.stdout + dry.stderr
    assert dry.stdout == (
        "would forget entity 'd:done' (at sequence 4, applied by key 'k4'): "
        "its next event would apply whatever its sequence\n"
    )
    assert messages(dry) == f"dry run: nothing changed on {target.store.url}\n"
    as_json = on(target.url, "forget", "--entity", "d:held", "--force", "--dry-run", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    assert json_doc(as_json, "action.schema.json") == {
        "action": "forget", "store": target.store.url, "store_source": "--store",
        "dry_run": True, "count": 1, "keys": None, "record": None,
        "entity": before["d:held"].to_json(),
    }  # fmt: skip
    for args, code in [
        (["forget", "--entity", "d:held", "--dry-run"], ExitCode.REFUSED),  # held: --force
        (["forget", "--entity", "d:missing", "--dry-run"], ExitCode.KEY_NOT_FOUND),
    ]:
        refused = on(target.url, *args)
        assert refused.exit_code == code, (args, refused.stdout + refused.stderr)
        assert refused.stdout == ""
    assert {n: entity_of(target, n) for n in names} == before  # nothing changed


# Usage errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["inspect"], "give a KEY, or --entity ENTITY"),
        (["inspect", "k", "--entity", "e"], "give a KEY or --entity ENTITY, not both"),
        (["inspect", "--entity", ""], "entity is empty"),
        (["inspect", "--entity", "e" * 513], "entity is 513 bytes long"),
        (["forget"], "give a KEY, or --entity ENTITY"),
        (["forget", "k", "--entity", "e"], "give a KEY or --entity ENTITY, not both"),
        (["forget", "--entity", "a\x01b"], "control character"),
        (["list", "--entities", "--status", "failed"], "--status"),
        (["list", "--entities", "--stale"], "--stale"),
        (["list", "--entities", "--released"], "--released"),
        (["list", "--entities", "--older-than", "5m"], "--older-than"),
        (["list", "--entities", "--limit", "-1"], "--limit"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    db = tmp_path / "never.db"
    result = on(f"sqlite:///{db}", *args)
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert says in " ".join(result.stderr.replace("│", " ").split())
    assert result.stdout == ""
    assert not db.exists()  # rejected before the store was opened


# init --dry-run --------------------------------------------------------------------------------


GUARD_PROVISIONING = {
    "sqlite": ["CREATE TABLE IF NOT EXISTS idem_entities (", "ON idem_entities (expires_at)"],
    "postgres": ['."entities" (', '."entities" (expires_at)'],
    "redis": [
        "SCRIPT LOAD guard.lua", "SCRIPT LOAD settle.lua", "SCRIPT LOAD forget_entity.lua",
        "SCRIPT LOAD finish.lua",
    ],
    "redis-cluster": [
        "SCRIPT LOAD guard.lua", "SCRIPT LOAD settle.lua", "SCRIPT LOAD forget_entity.lua",
        "SCRIPT LOAD finish.lua",
    ],
    "dynamodb": [],  # entities are items of the store's own table: nothing of their own
}  # fmt: skip
"""What ``init --dry-run`` shows of the sequence guard, per store."""


def test_init_dry_run_shows_what_the_guard_needs(bare: Target) -> None:
    bare.unload_scripts()  # Redis: as a server that never ran idemctl
    dry = on(bare.url, "init", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    plan = json_doc(on(bare.url, "init", "--dry-run", "--json"), "init.schema.json")
    for marker in GUARD_PROVISIONING[bare.name]:
        assert marker in dry.stdout, (marker, dry.stdout)
        assert any(marker in s for s in plan["statements"]), marker
    assert on(bare.url, "init").exit_code == 0
    apply(bare, "acct:1", 1, "k")  # what init made, the guard can use
    assert entities_listed(bare.url) == ["acct:1"]


def test_init_dry_run_shows_the_sqlite_guard_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    dry = on(url, "init", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    plan = json_doc(on(url, "init", "--dry-run", "--json"), "init.schema.json")
    guard = [s for s in plan["statements"] if "idem_entities" in s]
    assert len(guard) == 2, guard
    assert guard[0].startswith("CREATE TABLE IF NOT EXISTS idem_entities (")
    assert guard[1].startswith("CREATE INDEX IF NOT EXISTS idem_entities_expires ")
    assert all(s.rstrip(";") + ";" in dry.stdout for s in guard)
    assert not (tmp_path / "new.db").exists()
