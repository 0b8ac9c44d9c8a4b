"""Every idemctl command on every real store, in-process through CliRunner.

State is built with the library (claim / complete / fail / release), with the store's clock
set by the test, not by sleeps: a key claimed with a 10-minute lease and its times moved 20
minutes back (``Target.stale``) is stale, one claimed now is live for the whole test, a record
moved back (``Target.backdate``) is older than what the test lists, however loaded the
machine. A record past retention is one completed with a retention of 0.3 s and a sleep of
0.6 s (waiting longer only helps). Then the CLI's text, its JSON (checked against schemas/)
and its exit codes are compared with what the store holds. Stores: sqlite, redis,
redis-cluster, postgres and dynamodb (moto), each test on a store of its own
(tests/cli/helpers.py); memory:// only where a store that starts empty makes sense.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

import idemctl
from idemctl.cli.exitcodes import ExitCode
from tests.backends import BY_URL, KINDS, backends
from tests.cli.helpers import (  # noqa: F401 - fixtures
    COUNTED_BY,
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
    target_fixture,
    unprovisioned_fixture,
)

SERVED = backends(lambda k: k.unreachable is not None)
"""The stores behind a server of their own: each can be unreachable."""

FINGERPRINT = "ab" * 32


def keys_of(documents: list[dict[str, object]]) -> list[str]:
    return [str(d["key"]) for d in documents]


def listed(url: str, *args: str) -> list[str]:
    """Keys ``idemctl list --json ARGS`` prints (all of them: --limit 0), sorted."""
    result = on(url, "list", "--json", "--limit", "0", *args)
    assert result.exit_code == 0, result.stderr
    assert next_cursor(result) is None
    return sorted(keys_of(json_lines(result)))


def grid(text: str) -> dict[str, list[str]]:
    """A two-or-more-space separated grid (stats) as {first cell: the other cells}."""
    out = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0]:
            out[cells[0]] = cells[1:]
    return out


def unprovisioned_before(target: Target) -> None:
    """Make ``target`` look like a store nobody ran ``init`` on (Redis: no scripts loaded)."""
    target.unload_scripts()
    if KINDS[target.name].family == "sqlite":
        assert not sqlite_file(target).exists()


def sqlite_file(target: Target) -> Path:
    assert target.url.startswith("sqlite:///")
    return Path(target.url.removeprefix("sqlite:///"))


# init ------------------------------------------------------------------------------------


def test_init_dry_run_changes_nothing_then_twice_is_harmless(bare: Target) -> None:
    unprovisioned_before(bare)
    finding = KINDS[bare.name].provisions

    dry = on(bare.url, "init", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert KINDS[bare.name].init_marker in dry.stdout
    dry_json = on(bare.url, "init", "--dry-run", "--json")
    assert dry_json.exit_code == 0, dry_json.stderr
    plan = json_doc(dry_json, "init.schema.json")
    assert plan["dry_run"] is True
    assert plan["changed"] is False
    assert plan["statements"]
    for statement in plan["statements"]:
        assert statement.rstrip(";") in dry.stdout
    assert dry.stderr.startswith(store_line(bare.store.url))
    assert messages(dry).startswith(
        f"-- dry run: {len(plan['statements'])} statement(s) would run on {bare.store.url}"
    )
    if KINDS[bare.name].family == "sqlite":
        assert not sqlite_file(bare).exists()  # not even an empty file
    # The dry runs changed nothing: still not provisioned (Redis: scripts not loaded yet,
    # a warning only, since each loads on its first use).
    before = on(bare.url, "doctor", "--json")
    levels = {f["name"]: f["level"] for f in json_doc(before, "doctor.schema.json")["findings"]}
    if KINDS[bare.name].readable_bare:
        assert before.exit_code == doctor_exit(bare.name), before.stdout + before.stderr
        assert levels[finding] == "warn"
    else:
        assert before.exit_code == ExitCode.NOT_PROVISIONED, before.stdout + before.stderr
        assert levels[finding] == "fail"

    first = on(bare.url, "init")
    assert first.exit_code == 0, first.stderr
    assert first.stdout == ""
    assert f"provisioned {bare.store.url}: {len(plan['statements'])} statement(s) applied" in (
        first.stderr
    )
    second = on(bare.url, "init")
    assert second.exit_code == 0, second.stderr
    assert f"{bare.store.url} is up to date; nothing changed" in second.stderr
    again = on(bare.url, "init", "--json")
    assert again.exit_code == 0
    document = json_doc(again, "init.schema.json")
    assert document == {
        "store": bare.store.url, "store_source": "--store", "dry_run": False, "changed": False,
        "statements": [], "notes": document["notes"],
    }  # fmt: skip
    assert document["notes"]
    nothing = on(bare.url, "init", "--dry-run")
    assert nothing.exit_code == 0
    assert nothing.stdout.strip() == ""
    assert f"-- dry run: nothing to do on {bare.store.url}" in nothing.stderr

    after = on(bare.url, "doctor", "--json")
    assert after.exit_code != ExitCode.NOT_PROVISIONED
    assert {f["name"]: f["level"] for f in json_doc(after, "doctor.schema.json")["findings"]}[
        finding
    ] == "ok"
    # The library can use what init made.
    assert bare.completed("k", result=1).status.value == "completed"


def test_init_upgrades_an_old_postgres_schema(request: pytest.FixtureRequest) -> None:
    from idemctl.stores.postgres import PostgresStore, migrations

    target = make_target(request, "postgres")
    store = target.store
    assert isinstance(store, PostgresStore)
    store.provision(upto=1)  # as an older idemctl left it
    latest = max(migrations(store.names))
    assert latest > 1

    doctor = on(target.url, "doctor", "--json")
    assert doctor.exit_code == ExitCode.NOT_PROVISIONED
    schema = next(
        f for f in json_doc(doctor, "doctor.schema.json")["findings"] if f["name"] == "schema"
    )
    assert schema["ok"] is False
    assert f"at version 1 of {latest}" in schema["detail"]
    assert schema["fix"] == "run 'idemctl init'"

    dry = json_doc(on(target.url, "init", "--dry-run", "--json"), "init.schema.json")
    newer = [
        s for v in sorted(migrations(store.names)) if v > 1 for s in migrations(store.names)[v]
    ]
    assert all(s in dry["statements"] for s in newer)
    assert not any(s in dry["statements"] for s in migrations(store.names)[1])
    upgraded = on(target.url, "init")
    assert upgraded.exit_code == 0, upgraded.stderr
    assert f"provisioned {store.url}: {len(dry['statements'])} statement(s) applied" in (
        upgraded.stderr
    )
    assert on(target.url, "doctor").exit_code == 0


def test_init_json_reports_what_it_provisioned(bare: Target) -> None:
    unprovisioned_before(bare)
    result = on(bare.url, "init", "--json")
    assert result.exit_code == 0, result.stderr
    document = json_doc(result, "init.schema.json")
    assert document["store"] == bare.store.url
    assert document["dry_run"] is False
    assert document["changed"] is True
    assert any(KINDS[bare.name].init_marker in s for s in document["statements"])
    assert document["store_source"] == "--store"
    assert result.stderr == store_line(bare.store.url)  # which store, also with --json


# inspect ---------------------------------------------------------------------------------

ROW_NAMES = [
    "key", "status", "owner", "fencing token", "attempts", "lease", "age", "updated",
    "completed", "retention", "fingerprint", "error", "result",
]  # fmt: skip


def test_inspect_shows_every_field(target: Target) -> None:
    done = target.completed("i:done", result={"n": 1, "text": "grüße"}, fingerprint=FINGERPRINT)
    live = target.claim("i:live")
    failed = target.failed("i:failed", error="card declined", retriable=True)
    # Claimed, released, claimed again: attempt 2 with the fencing token one past the first.
    first = target.claim("i:again")
    target.store.release("i:again", first.owner, first.fencing_token)
    again = target.claim("i:again")
    assert (again.attempt, again.fencing_token) == (2, first.fencing_token + 1)
    target.store.release("i:again", again.owner, again.fencing_token)

    shown = {}
    for key in ("i:done", "i:live", "i:failed", "i:again"):
        result = on(target.url, "inspect", key)
        assert result.exit_code == 0, result.stderr
        shown[key] = rows(result.stdout)
        assert list(shown[key]) == ROW_NAMES, result.stdout
        assert shown[key]["key"] == key

    d = shown["i:done"]
    assert d["status"] == "completed"
    assert d["owner"] == "-"
    assert d["fencing token"] == str(done.fencing_token)
    assert d["attempts"] == "1"
    assert d["lease"] == "-"
    assert d["fingerprint"] == FINGERPRINT
    assert d["error"] == "-"
    assert d["completed"] != "-"
    assert d["retention"].startswith("until ")
    assert d["result"].replace("\n", "").replace(" ", "") == '{"n":1,"text":"grüße"}'
    stored = target.get("i:done")
    assert stored is not None and stored.expires_at is not None
    assert stored.expires_at.strftime("%Y-%m-%d %H:%M:%SZ") in d["retention"]
    assert stored.created_at.strftime("%Y-%m-%d %H:%M:%SZ") in d["age"]

    lv = shown["i:live"]
    assert lv["status"] == "in_progress"
    assert lv["owner"] == live.owner
    assert lv["fencing token"] == str(live.fencing_token)
    held = target.get("i:live")
    assert held is not None and held.lease_expires_at is not None
    assert lv["lease"].endswith(f"left ({held.lease_expires_at.strftime('%Y-%m-%d %H:%M:%SZ')})")
    assert lv["completed"] == "-"
    assert lv["retention"] == "-"
    assert lv["fingerprint"] == "-"
    assert lv["result"] == "-"

    f = shown["i:failed"]
    assert f["status"] == "failed (retriable)"
    assert f["error"] == "card declined"
    assert f["result"] == "-"
    assert failed.error == "card declined"

    a = shown["i:again"]
    assert a["status"] == "in_progress (released)"  # freed, waiting for its next delivery
    assert a["owner"] == "-"
    assert a["lease"] == "released"
    assert (a["fencing token"], a["attempts"]) == (str(again.fencing_token), "2")


def test_inspect_json_is_the_record(target: Target) -> None:
    target.completed("j:done", result=[1, "two", {"three": None}], fingerprint=FINGERPRINT)
    target.claim("j:live")
    target.failed("j:failed", error="x" * 300)
    for key in ("j:done", "j:live", "j:failed"):
        record = target.get(key)
        assert record is not None
        # --json at the root and after the command, --store after the command: all the same.
        for args in (
            ["--store", target.url, "--json", "inspect", key],
            ["inspect", key, "--json", "--store", target.url],
        ):
            result = run(args)
            assert result.exit_code == 0, result.stderr
            assert json_doc(result, "record.schema.json") == record.to_json()
            assert result.stdout.count("\n") == 1


def test_inspect_missing_key_is_exit_5(target: Target) -> None:
    target.completed("there")
    for extra in ([], ["--json"]):
        result = on(target.url, "inspect", "not-there", *extra)
        assert result.exit_code == ExitCode.KEY_NOT_FOUND
        assert result.stdout == ""
        assert result.stderr == store_line(target.store.url) + (
            "error: no record for key 'not-there'\n"
        )


# list ------------------------------------------------------------------------------------


@pytest.mark.clock
def test_list_filters(target: Target) -> None:
    # Made 20 minutes ago (their clock set back), the stale key too.
    for n in (1, 2, 3):
        target.completed(f"a:{n}", result=n)
        target.backdate(f"a:{n}")
    stale = target.stale("b:stale")
    target.failed("c:fail", error="nope")
    target.backdate("c:fail")
    # Made now: younger than 10 minutes however long the listings below take.
    target.completed("a:new")
    live = target.claim("b:live")
    old = ["a:1", "a:2", "a:3", "b:stale", "c:fail"]
    assert listed(target.url, "--older-than", "10m") == old
    assert listed(target.url, "--older-than", "10m", "--prefix", "a:") == ["a:1", "a:2", "a:3"]
    assert listed(target.url, "--older-than", "10m", "--status", "in_progress") == ["b:stale"]

    everything = sorted([*old, "a:new", "b:live"])
    assert listed(target.url) == everything
    assert listed(target.url, "--status", "completed") == ["a:1", "a:2", "a:3", "a:new"]
    assert listed(target.url, "--status", "in_progress") == ["b:live", "b:stale"]
    assert listed(target.url, "--status", "failed") == ["c:fail"]
    assert listed(target.url, "--stale") == ["b:stale"]
    assert listed(target.url, "--prefix", "b:") == ["b:live", "b:stale"]
    assert listed(target.url, "--prefix", "a:", "--status", "failed") == []

    # The JSON lines are the records as the store holds them.
    result = on(target.url, "list", "--json", "--limit", "0")
    assert result.exit_code == 0
    for document in json_lines(result):
        record = target.get(document["key"])
        assert record is not None
        assert document == record.to_json()

    # The table: one row per key, stale marked, tokens and attempts as stored.
    shown = on(target.url, "list")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stderr == store_line(target.store.url)
    cells = table(shown.stdout)
    assert sorted(cells) == everything
    token = {k: str(r.fencing_token) for k in everything if (r := target.get(k)) is not None}
    assert cells["b:stale"][:3] == ["in_progress (stale)", token["b:stale"], "1"]
    assert cells["b:stale"][3].startswith("expired ")
    assert cells["b:live"][:3] == ["in_progress", token["b:live"], "1"]
    assert cells["b:live"][3].endswith(" left")
    assert cells["c:fail"][:4] == ["failed (permanent)", token["c:fail"], "1", "-"]
    assert cells["a:2"][:4] == ["completed", token["a:2"], "1", "-"]
    assert token["b:stale"] == str(stale.fencing_token)
    assert token["b:live"] == str(live.fencing_token)

    # What list --stale shows is what unlock --stale frees: one key, so no question asked.
    assert list(table(on(target.url, "list", "--stale").stdout)) == ["b:stale"]
    assert on(target.url, "unlock", "--stale", "--dry-run").stdout.splitlines() == ["b:stale"]
    freed = on(target.url, "unlock", "--stale")
    assert freed.exit_code == 0, freed.stderr
    assert freed.stdout.strip() == f"freed 1 lease(s) on {target.store.url}: b:stale"
    assert "?" not in messages(freed)  # one key: no question asked
    # Freed, it is no longer stale: released, waiting for the next delivery.
    assert listed(target.url, "--stale") == []
    assert listed(target.url, "--released") == ["b:stale"]
    freed_row = table(on(target.url, "list", "--released").stdout)["b:stale"]
    assert (freed_row[0], freed_row[3]) == ("in_progress (released)", "released")
    both = on(target.url, "list", "--stale", "--released")
    assert both.exit_code == ExitCode.USAGE and "pick one" in both.stderr
    record = target.get("b:live")
    assert record is not None and record.owner == live.owner


def test_list_nothing_matches(target: Target) -> None:
    target.completed("x:1")
    for args in (["--older-than", "1h"], ["--status", "failed"], ["--stale"], ["--prefix", "y"]):
        result = on(target.url, "list", *args)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == ""
        assert "no records match" in result.stderr
    as_json = on(target.url, "list", "--json", "--prefix", "y")
    assert as_json.exit_code == 0
    assert as_json.stdout == ""


def test_list_pages_with_cursor(target: Target) -> None:
    keys = [f"p:{n:02d}" for n in range(11)]
    for key in keys:
        target.completed(key)
    target.claim("q:other")

    def pages(limit: int, *args: str, as_json: bool = True) -> list[list[str]]:
        out, cursor = [], None
        for _ in range(50):
            more = ["--cursor", cursor] if cursor is not None else []
            result = on(
                target.url, "list", "--limit", str(limit), *args, *more,
                *(["--json"] if as_json else []),
            )  # fmt: skip
            assert result.exit_code == 0, result.stderr
            page = keys_of(json_lines(result)) if as_json else list(table(result.stdout))
            out.append(page)
            cursor = next_cursor(result)
            if cursor is None:
                return out
            assert re.search(rf"showing {len(page)}; for more: idemctl list", result.stderr)
        raise AssertionError(f"list --limit {limit} did not end: {out}")

    for limit, args, as_json, expected in (
        (3, ["--prefix", "p:"], True, keys),
        (4, [], True, [*keys, "q:other"]),
        (5, ["--prefix", "p:"], False, keys),
        (2, ["--status", "completed"], True, keys),
        (1, ["--status", "in_progress"], True, ["q:other"]),
    ):
        got = pages(limit, *args, as_json=as_json)
        seen = [k for page in got for k in page]
        assert sorted(seen) == expected, got  # every key, once
        assert all(len(page) <= limit for page in got), got
        assert all(got[:-1]), got  # no empty page before the last

    everything = on(target.url, "list", "--limit", "0", "--json")
    assert sorted(keys_of(json_lines(everything))) == [*keys, "q:other"]
    assert "showing" not in everything.stderr
    default = on(target.url, "list", "--json")  # the default limit is 50
    assert len(json_lines(default)) == 12
    assert next_cursor(default) is None


@pytest.mark.parametrize("name", BY_URL)
def test_list_offers_a_cursor_only_when_more_remain(
    request: pytest.FixtureRequest, name: str
) -> None:
    target = make_target(request, name, provision=True)
    for n in range(4):
        target.completed(f"e:{n}")
    whole = on(target.url, "list", "--limit", "4", "--json")
    assert whole.exit_code == 0
    assert len(json_lines(whole)) == 4
    assert next_cursor(whole) is None, whole.stderr
    half = on(target.url, "list", "--limit", "2", "--json")
    cursor = next_cursor(half)
    assert cursor is not None
    rest = on(target.url, "list", "--limit", "2", "--json", "--cursor", cursor)
    assert len(json_lines(rest)) == 2
    assert next_cursor(rest) is None, rest.stderr


@pytest.mark.parametrize("name", backends(lambda k: k.by_url and k.own_cursor))
def test_list_bad_cursor_is_a_usage_error(request: pytest.FixtureRequest, name: str) -> None:
    from typer.testing import CliRunner

    from idemctl.cli import app

    target = make_target(request, name, provision=True)
    target.completed("a")
    result = CliRunner().invoke(app, ["--store", target.url, "list", "--cursor", "garbage"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == ExitCode.USAGE
    assert "--cursor" in result.stderr


ODD_KEYS = [
    "o:[bold]markup[/bold]", "o:*star", "o:?mark", "o:%_percent", "o:ünï cødé ✓",
    "o:with space", "o:back\\slash", "o:{brace}", "o:x",
]  # fmt: skip


def test_odd_keys_are_shown_and_matched_literally(target: Target) -> None:
    for key in ODD_KEYS:
        target.completed(key, result=key)
    target.completed("other")
    everything = on(target.url, "list", "--json", "--prefix", "o:")
    documents = json_lines(everything)
    assert sorted(keys_of(documents)) == sorted(ODD_KEYS)
    assert all(d["key"] == d["result"] for d in documents)
    # Glob (Redis), LIKE (SQL) and markup (rich) characters mean nothing in a prefix.
    for prefix, expected in (
        ("o:[", ["o:[bold]markup[/bold]"]), ("o:*", ["o:*star"]), ("o:?", ["o:?mark"]),
        ("o:%", ["o:%_percent"]), ("o:_", []), ("o:back\\", ["o:back\\slash"]),
        ("o:{", ["o:{brace}"]),
    ):  # fmt: skip
        assert listed(target.url, "--prefix", prefix) == expected, prefix
    shown = table(on(target.url, "list", "--prefix", "o:").stdout)
    assert sorted(shown) == sorted(ODD_KEYS)
    for key in ("o:[bold]markup[/bold]", "o:ünï cødé ✓"):
        detail = on(target.url, "inspect", key)
        assert detail.exit_code == 0, detail.stderr
        assert rows(detail.stdout)["key"] == key
        as_json = json_doc(on(target.url, "inspect", key, "--json"), "record.schema.json")
        assert as_json["key"] == as_json["result"] == key
    forgot = on(target.url, "forget", "o:[bold]markup[/bold]")
    assert forgot.exit_code == 0, forgot.stderr
    assert forgot.stdout.startswith("forgot 'o:[bold]markup[/bold]' (it was completed)")
    missing = on(target.url, "inspect", "o:[red]nope[/red]")
    assert missing.exit_code == ExitCode.KEY_NOT_FOUND
    assert "no record for key 'o:[red]nope[/red]'" in missing.stderr


# stats -----------------------------------------------------------------------------------


@pytest.mark.clock
def test_stats_counts_what_was_made(target: Target) -> None:
    target.stale("s:stale-1")  # the oldest in progress
    target.stale("s:stale-2")
    released = target.claim("s:released")
    target.store.release("s:released", released.owner, released.fencing_token)
    for n in range(3):
        target.completed(f"s:done-{n}")
    target.failed("s:failed-1")
    target.failed("s:failed-2", retriable=True)
    target.claim("s:live")
    target.completed("s:gone-1")
    target.completed("s:gone-2")
    # Past retention a minute ago, so its second is over too (where an index counts a
    # record until then): the store's clock set, not waited for.
    target.expire_retention("s:gone-1")
    target.expire_retention("s:gone-2")
    # Redis and DynamoDB tell their TTL to drop a record past retention (Redis does at
    # once; moto never does); SQLite and PostgreSQL keep it until purged.
    past = 0 if KINDS[target.name].family == "redis" else 2

    result = on(target.url, *stats_args(target))
    assert result.exit_code == 0, result.stderr
    document = json_doc(result, "stats.schema.json")
    oldest = target.get("s:stale-1")
    assert oldest is not None
    expected_at = oldest.to_json()["created_at"]
    assert document == {
        "store": target.store.url,
        "store_source": "--store",
        "total": 9,
        "by_status": {"in_progress": 4, "completed": 3, "failed": 2},
        "stale": 2,  # expired, never freed
        "released": 1,  # freed, waiting for the next delivery: not stale
        "oldest_in_progress_at": document["oldest_in_progress_at"],
        "oldest_in_progress_age_seconds": document["oldest_in_progress_age_seconds"],
        "past_retention": past,
        "entities": 0,
        "counted_by": COUNTED_BY[target.name],
    }

    # Stores keep milliseconds or microseconds: compare the instant, not the spelling.
    def instant(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    assert abs(instant(document["oldest_in_progress_at"]) - instant(str(expected_at))) < 0.002
    assert document["oldest_in_progress_age_seconds"] > 0
    approximate_agrees(target, document)

    shown = on(target.url, *stats_args(target, as_json=False))
    assert shown.exit_code == 0, shown.stderr
    cells = grid(shown.stdout)
    assert cells["in_progress"] == ["4"]
    assert cells["completed"] == ["3"]
    assert cells["failed"] == ["2"]
    assert cells["total"] == ["9"]
    assert cells["stale leases"][0] == "2"
    assert "idemctl unlock --stale" in cells["stale leases"][1]
    assert cells["released"][0] == "1"
    assert "idemctl list --released" in cells["released"][1]
    assert cells["oldest in progress"][1].startswith("created ")
    if past:
        assert cells["past retention"] == ["2", "kept until purged: idemctl purge"]
    else:
        assert "past retention" not in cells

    # purge --yes removes them without asking; the counts stay.
    purged = on(target.url, "purge", "--yes", "--json")
    assert purged.exit_code == 0, purged.stderr
    assert "Delete" not in purged.stderr
    assert json_doc(purged, "action.schema.json") == {
        "action": "purge", "store": target.store.url, "store_source": "--store",
        "dry_run": False, "count": past, "keys": None, "record": None, "entity": None,
    }  # fmt: skip
    after = json_doc(on(target.url, *stats_args(target)), "stats.schema.json")
    assert (after["past_retention"], after["total"], after["stale"]) == (0, 9, 2)


def test_stats_empty_store(target: Target) -> None:
    result = on(target.url, *stats_args(target))
    assert result.exit_code == 0, result.stderr
    assert json_doc(result, "stats.schema.json") == {
        "store": target.store.url, "store_source": "--store", "total": 0,
        "by_status": {"in_progress": 0, "completed": 0, "failed": 0}, "stale": 0,
        "released": 0, "oldest_in_progress_at": None, "oldest_in_progress_age_seconds": None,
        "past_retention": 0, "entities": 0, "counted_by": COUNTED_BY[target.name],
    }  # fmt: skip
    shown = grid(on(target.url, *stats_args(target, as_json=False)).stdout)
    assert shown["total"] == ["0"]
    assert shown["oldest in progress"] == ["-"]


# doctor ----------------------------------------------------------------------------------


def doctor_exit(name: str) -> ExitCode:
    """What doctor exits with on a provisioned store of backend ``name``: the test
    redis-server runs without persistence, and doctor says so."""
    return ExitCode.OK if KINDS[name].durable_here else ExitCode.UNEXPECTED


def test_doctor_on_a_provisioned_store(target: Target) -> None:
    result = on(target.url, "doctor", "--json")
    expected = doctor_exit(target.name)
    assert result.exit_code == expected, result.stdout + result.stderr
    document = json_doc(result, "doctor.schema.json")
    assert document["store"] == target.store.url
    assert document["store_source"] == "--store"
    assert document["ok"] is (expected == ExitCode.OK)
    findings = document["findings"]
    assert findings[0] == {
        "name": "store", "ok": True, "level": "ok", "fix": None,
        "detail": f"{target.store.url} (from --store)",
    }  # fmt: skip
    for f in findings:
        assert f["level"] in (("warn", "ok") if f["ok"] else ("fail",))
    failing = [f for f in findings if not f["ok"]]
    names = {f["name"] for f in findings}
    if expected == ExitCode.OK:
        assert failing == []
    else:
        appendonly = next(f for f in failing if f["name"] == "appendonly")
        assert appendonly["detail"] == "appendonly no"
        assert "CONFIG SET appendonly yes" in appendonly["fix"]
        assert {"connection", "scripts", "clock"} <= names
        assert not {"connection", "scripts"} & {f["name"] for f in failing}
        # Redis's default appendfsync everysec is a trade-off: a warning, not a failure.
        appendfsync = next(f for f in findings if f["name"] == "appendfsync")
        assert appendfsync["level"] == "warn" and appendfsync["ok"] is True
        assert "everysec" in appendfsync["detail"] and "always" in appendfsync["fix"]
    if KINDS[target.name].clock == "server":  # SQLite runs on this machine's clock
        assert "clock" in names

    shown = on(target.url, "doctor")
    assert shown.exit_code == expected
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["ok", "store", target.store.url]
    if expected == ExitCode.OK:
        assert "all checks passed" in shown.stderr
        assert "FAIL" not in shown.stdout
    else:
        assert f"{len(failing)} problem(s) found" in shown.stderr
        assert re.search(r"FAIL\s+appendonly\s+appendonly no", shown.stdout)
        assert "fix: CONFIG SET appendonly yes" in shown.stdout


def test_doctor_warns_of_redis_defaults_and_unloaded_scripts_without_failing(
    tmp_path: Path,
) -> None:
    """A Redis with the AOF on and its default appendfsync everysec, whose scripts nobody
    loaded yet and whose index nobody built: three warnings (the fsync trade-off; scripts
    load on first use; the operator's commands read every key until init), exit 0."""
    from tests.backends import unique_prefix
    from tests.servers import RedisServer

    with RedisServer(tmp_path, "--appendonly", "yes") as server:
        server.cli("SCRIPT", "FLUSH")
        url = server.url(query=f"prefix={unique_prefix()}")
        result = on(url, "doctor", "--json")
        assert result.exit_code == ExitCode.OK, result.stdout + result.stderr
        document = json_doc(result, "doctor.schema.json")
        assert document["ok"] is True
        found = {f["name"]: f for f in document["findings"]}
        assert {n for n, f in found.items() if f["level"] != "ok"} == {
            "appendfsync",
            "scripts",
            "index",
        }
        assert "read every key" in found["index"]["detail"]
        assert "idemctl init" in found["index"]["fix"]
        fsync, scripts = found["appendfsync"], found["scripts"]
        assert (fsync["level"], fsync["ok"], fsync["detail"]) == (
            "warn",
            True,
            "appendfsync everysec",
        )
        assert "last second" in fsync["fix"] and "appendfsync always" in fsync["fix"]
        assert (scripts["level"], scripts["ok"]) == ("warn", True)
        assert "first use" in scripts["detail"] and "idemctl init" in scripts["fix"]

        shown = on(url, "doctor")
        assert shown.exit_code == ExitCode.OK, shown.stdout + shown.stderr
        assert re.search(r"WARN\s+appendfsync\s+appendfsync everysec", shown.stdout)
        assert re.search(r"WARN\s+scripts\s+not loaded yet", shown.stdout)
        assert "note: a crash of the server's machine" in shown.stdout
        assert "FAIL" not in shown.stdout
        assert "all checks passed, 3 warning(s)" in shown.stderr
        assert on(url, "init").exit_code == ExitCode.OK
        ready = {
            f["name"]: f
            for f in json_doc(on(url, "doctor", "--json"), "doctor.schema.json")["findings"]
        }
        assert ready["index"]["level"] == "ok" and ready["index"]["detail"].startswith("ready")

        server.cli("CONFIG", "SET", "appendfsync", "no")  # this one is a failure
        fails = on(url, "doctor", "--json")
        assert fails.exit_code == ExitCode.UNEXPECTED, fails.stdout + fails.stderr
        failing = [f for f in json_doc(fails, "doctor.schema.json")["findings"] if not f["ok"]]
        assert [(f["name"], f["level"]) for f in failing] == [("appendfsync", "fail")]


def test_doctor_every_problem_has_a_fix_redis(request: pytest.FixtureRequest) -> None:
    target = make_target(request, "redis", provision=True)
    result = on(target.url, "doctor", "--json")
    assert result.exit_code == ExitCode.UNEXPECTED
    failing = [f for f in json_doc(result, "doctor.schema.json")["findings"] if not f["ok"]]
    assert failing
    assert [f for f in failing if not f["fix"]] == []


def test_doctor_other_problems_are_exit_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/lax.db?synchronous=normal"
    assert on(url, "init").exit_code == 0
    result = on(url, "doctor", "--json")
    assert result.exit_code == ExitCode.UNEXPECTED, result.stdout + result.stderr
    document = json_doc(result, "doctor.schema.json")
    assert document["ok"] is False
    failing = [f for f in document["findings"] if not f["ok"]]
    assert [f["name"] for f in failing] == ["durability"]
    assert failing[0]["detail"] == "synchronous=normal"
    assert "synchronous=full" in failing[0]["fix"]
    shown = on(url, "doctor")
    assert shown.exit_code == ExitCode.UNEXPECTED
    assert "1 problem(s) found" in shown.stderr


def test_doctor_on_an_unprovisioned_store_is_exit_4(unprovisioned: Target) -> None:
    bare = unprovisioned
    unprovisioned_before(bare)
    name = KINDS[bare.name].provisions
    result = on(bare.url, "doctor", "--json")
    assert result.exit_code == ExitCode.NOT_PROVISIONED, result.stdout + result.stderr
    document = json_doc(result, "doctor.schema.json")
    assert document["ok"] is False
    finding = next(f for f in document["findings"] if f["name"] == name)
    assert finding["ok"] is False
    assert "idemctl init" in finding["fix"]
    shown = on(bare.url, "doctor")
    assert shown.exit_code == ExitCode.NOT_PROVISIONED
    assert re.search(rf"FAIL\s+{name}\s", shown.stdout)
    assert "fix: run 'idemctl init'" in shown.stdout
    if KINDS[bare.name].family == "sqlite":
        assert not sqlite_file(bare).exists()  # looking created no database


def unreachable_url(name: str) -> str:
    """A URL of ``name``'s kind where nothing listens (and that gives up within a second)."""
    from tests.servers import free_port

    port = free_port()
    unreachable = KINDS[name].unreachable
    assert unreachable is not None, name
    return unreachable(port)


@pytest.mark.parametrize("name", SERVED)
def test_doctor_on_an_unreachable_store_is_exit_3(name: str, aws_credentials: None) -> None:
    url = unreachable_url(name)
    result = on(url, "doctor", "--json")
    assert result.exit_code == ExitCode.STORE_UNREACHABLE, result.stdout + result.stderr
    document = json_doc(result, "doctor.schema.json")
    assert document["ok"] is False
    assert document["findings"][0]["name"] == "store"
    connection = next(f for f in document["findings"] if f["name"] == "connection")
    assert connection["ok"] is False
    assert "unreachable" in connection["detail"] or "connect" in connection["detail"]
    assert connection["fix"]
    assert ":pw@" not in result.stdout + result.stderr  # the URL shows redacted
    shown = on(url, "doctor")
    assert shown.exit_code == ExitCode.STORE_UNREACHABLE
    assert re.search(r"FAIL\s+connection\s", shown.stdout)


@pytest.mark.parametrize("name", SERVED)
def test_commands_on_an_unreachable_store_exit_3(name: str, aws_credentials: None) -> None:
    url = unreachable_url(name)
    for args in (["list", "--json"], ["unlock", "--stale", "--yes"]):
        result = on(url, *args)
        assert result.exit_code == ExitCode.STORE_UNREACHABLE, result.stdout + result.stderr
        assert result.stdout == ""
        assert messages(result).startswith("error: ")
        assert ":pw@" not in result.stderr


# Commands on a store nobody provisioned -------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["list"], ["list", "--json"], ["stats"], ["inspect", "k"], ["unlock", "k"],
        ["unlock", "--stale", "--yes"], ["forget", "k"], ["purge", "--yes"],
    ],
    ids=" ".join,
)  # fmt: skip
def test_commands_on_an_unprovisioned_store_exit_4(unprovisioned: Target, args: list[str]) -> None:
    result = on(unprovisioned.url, *args)
    assert result.exit_code == ExitCode.NOT_PROVISIONED, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("store: ")
    assert messages(result).startswith("error: ")
    assert "idemctl init" in result.stderr
    assert len(messages(result).strip().splitlines()) == 1
    if KINDS[unprovisioned.name].family == "sqlite":
        assert not sqlite_file(unprovisioned).exists()  # looking created nothing


# unlock KEY ------------------------------------------------------------------------------


@pytest.mark.clock
def test_unlock_key(target: Target) -> None:
    live = target.claim("u:live")
    held = target.stale("u:stale")
    target.stale("u:stale-2")
    target.stale("u:stale-3")
    target.completed("u:done")
    target.failed("u:failed")

    refused = on(target.url, "unlock", "u:live")
    assert refused.exit_code == ExitCode.REFUSED
    assert refused.stdout == ""
    assert "live lease" in refused.stderr and "--force" in refused.stderr
    record = target.get("u:live")
    assert record is not None
    assert (record.owner, record.fencing_token) == (live.owner, live.fencing_token)  # untouched

    forced = on(target.url, "unlock", "u:live", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert forced.stdout.strip() == (
        f"unlocked 'u:live': fencing token {live.fencing_token}, "
        f"the next claim gets {live.fencing_token + 1}"
    )
    record = target.get("u:live")
    assert record is not None and record.owner is None
    assert record.status.value == "in_progress"
    again = target.claim("u:live")
    assert (again.fencing_token, again.attempt) == (live.fencing_token + 1, 2)
    # The old owner can no longer complete.
    with pytest.raises(idemctl.LeaseLost):
        target.store.complete("u:live", live.owner, live.fencing_token, "late")

    # An expired lease needs no --force; --json says what the record became.
    freed = on(target.url, "unlock", "u:stale", "--json")
    assert freed.exit_code == 0, freed.stderr
    document = json_doc(freed, "action.schema.json")
    after = target.get("u:stale")
    assert after is not None and after.owner is None
    assert {k: v for k, v in document.items() if k != "record"} == {
        "action": "unlock", "store": target.store.url,
        "store_source": "--store", "dry_run": False, "count": 1,
        "keys": ["u:stale"], "entity": None,
    }  # fmt: skip
    assert document["record"]["key"] == "u:stale"
    assert document["record"]["owner"] is None
    assert document["record"]["status"] == "in_progress"
    assert document["record"]["fencing_token"] == held.fencing_token
    assert target.claim("u:stale").fencing_token == held.fencing_token + 1

    for key in ("u:done", "u:failed"):
        for force in ([], ["--force"]):
            result = on(target.url, "unlock", key, *force)
            assert result.exit_code == ExitCode.REFUSED, result.stdout + result.stderr
            assert "there is no lease to unlock" in result.stderr
    missing = on(target.url, "unlock", "u:missing")
    assert missing.exit_code == ExitCode.KEY_NOT_FOUND
    assert "no record for key 'u:missing'" in missing.stderr

    # Two stale leases left: --yes frees both without asking.
    rest = on(target.url, "unlock", "--stale", "--yes", "--json")
    assert rest.exit_code == 0, rest.stderr
    assert "Free" not in rest.stderr
    assert json_doc(rest, "action.schema.json") == {
        "action": "unlock", "store": target.store.url,
        "store_source": "--store", "dry_run": False, "count": 2,
        "keys": ["u:stale-2", "u:stale-3"], "record": None, "entity": None,
    }  # fmt: skip
    for key in ("u:stale-2", "u:stale-3"):
        record = target.get(key)
        assert record is not None and record.owner is None
    record = target.get("u:live")
    assert record is not None and record.owner == again.owner  # the live lease, untouched


@pytest.mark.parametrize("name", BY_URL)
def test_unlock_json_record_is_the_stored_record(request: pytest.FixtureRequest, name: str) -> None:
    target = make_target(request, name, provision=True)
    target.claim("u:live")
    result = on(target.url, "unlock", "u:live", "--force", "--json")
    assert result.exit_code == 0, result.stderr
    stored = target.get("u:live")
    assert stored is not None and stored.owner is None
    assert json_doc(result, "action.schema.json")["record"] == stored.to_json()


@pytest.mark.clock
def test_unlock_and_forget_one_key_dry_run_change_nothing(target: Target) -> None:
    """The dry run makes the checks the real command makes (and refuses what it refuses),
    shows what would change, and writes nothing."""
    live = target.claim("d:live")
    done = target.completed("d:done", result=1)
    target.stale("d:stale")
    keys = ("d:live", "d:done", "d:stale")
    before = {k: target.get(k) for k in keys}

    dry = on(target.url, "unlock", "d:live", "--force", "--dry-run")
    assert dry.exit_code == 0, dry.stdout + dry.stderr
    assert dry.stdout.strip() == (
        f"would unlock 'd:live': fencing token {live.fencing_token}, "
        f"the next claim would get {live.fencing_token + 1}"
    )
    assert messages(dry) == f"dry run: nothing changed on {target.store.url}\n"
    as_json = on(target.url, "unlock", "d:live", "--force", "--dry-run", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    document = json_doc(as_json, "action.schema.json")
    assert {k: v for k, v in document.items() if k != "record"} == {
        "action": "unlock", "store": target.store.url, "store_source": "--store",
        "dry_run": True, "count": 1, "keys": ["d:live"], "entity": None,
    }  # fmt: skip
    assert document["record"]["owner"] is None  # as the record would be
    assert document["record"]["fencing_token"] == live.fencing_token
    assert on(target.url, "unlock", "d:stale", "--dry-run").exit_code == 0  # expired: no force
    for args, code in [
        (["unlock", "d:live", "--dry-run"], ExitCode.REFUSED),  # live: needs --force
        (["unlock", "d:done", "--force", "--dry-run"], ExitCode.REFUSED),  # no lease
        (["unlock", "d:missing", "--dry-run"], ExitCode.KEY_NOT_FOUND),
        (["forget", "d:live", "--dry-run"], ExitCode.REFUSED),  # in progress: needs --force
        (["forget", "d:missing", "--dry-run"], ExitCode.KEY_NOT_FOUND),
    ]:
        refused = on(target.url, *args)
        assert refused.exit_code == code, (args, refused.stdout + refused.stderr)
        assert refused.stdout == ""

    forget = on(target.url, "forget", "d:done", "--dry-run")
    assert forget.exit_code == 0, forget.stdout + forget.stderr
    assert forget.stdout.strip() == (
        "would forget 'd:done' (it is completed): its next delivery would run the handler again"
    )
    assert messages(forget) == f"dry run: nothing changed on {target.store.url}\n"
    forget_json = on(target.url, "forget", "d:live", "--force", "--dry-run", "--json")
    assert forget_json.exit_code == 0, forget_json.stderr
    document = json_doc(forget_json, "action.schema.json")
    assert (document["action"], document["dry_run"], document["keys"]) == (
        "forget", True, ["d:live"],
    )  # fmt: skip
    assert document["record"] == before["d:live"].to_json()  # type: ignore[union-attr]
    assert (
        json_doc(on(target.url, "forget", "d:done", "--dry-run", "--json"), "action.schema.json")[
            "record"
        ]
        == done.to_json()
    )

    assert {k: target.get(k) for k in keys} == before  # nothing changed anywhere


# unlock --stale --------------------------------------------------------------------------


@pytest.mark.clock
def test_unlock_stale(target: Target) -> None:
    stale = ["s:1", "s:2", "s:3"]
    first = {key: target.stale(key) for key in stale}  # leases that ended 10 minutes ago
    live = target.claim("l:1")
    target.completed("c:1")
    released = target.claim("r:1")
    target.store.release("r:1", released.owner, released.fencing_token)

    def owners() -> dict[str, str | None]:
        out = {}
        for key in [*stale, "l:1"]:
            record = target.get(key)
            assert record is not None
            out[key] = record.owner
        return out

    held = owners()
    assert all(held.values())

    dry = on(target.url, "unlock", "--stale", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.splitlines() == stale  # exactly the stale keys, sorted
    assert f"dry run: 3 lease(s) would be freed, on {target.store.url}" in dry.stderr
    dry_json = on(target.url, "unlock", "--stale", "--dry-run", "--json")
    assert dry_json.exit_code == 0
    assert json_doc(dry_json, "action.schema.json") == {
        "action": "unlock", "store": target.store.url,
        "store_source": "--store", "dry_run": True, "count": 3,
        "keys": stale, "record": None, "entity": None,
    }  # fmt: skip
    assert owners() == held

    # --older-than: leases that ended at least that long ago (these ended 10 minutes ago).
    recent = on(target.url, "unlock", "--stale", "--older-than", "5m", "--dry-run")
    assert recent.stdout.splitlines() == stale
    none_yet = on(target.url, "unlock", "--stale", "--older-than", "1h", "--yes", "--json")
    assert none_yet.exit_code == 0
    assert json_doc(none_yet, "action.schema.json") == {
        "action": "unlock", "store": target.store.url,
        "store_source": "--store", "dry_run": False, "count": 0,
        "keys": [], "record": None, "entity": None,
    }  # fmt: skip
    assert owners() == held  # no lease ended an hour ago

    for answer in ("n\n", None):  # declined, or no answer at all
        declined = on(target.url, "unlock", "--stale", input=answer)
        assert declined.exit_code == ExitCode.REFUSED, declined.stdout + declined.stderr
        assert f"Free 3 stale lease(s) on {target.store.url}?" in declined.stderr
        assert "nothing changed: not confirmed" in declined.stderr
        assert declined.stdout == ""
        assert owners() == held

    agreed = on(target.url, "unlock", "--stale", input="y\n")
    assert agreed.exit_code == 0, agreed.stderr
    assert "Free 3 stale lease(s)" in agreed.stderr
    assert agreed.stdout.strip() == f"freed 3 lease(s) on {target.store.url}: s:1, s:2, s:3"
    now = owners()
    assert [now[k] for k in stale] == [None, None, None]
    assert now["l:1"] == live.owner  # the live lease was left alone
    record = target.get("l:1")
    assert record is not None and record.fencing_token == live.fencing_token

    # Nothing stale any more.
    empty = on(target.url, "unlock", "--stale", "--dry-run", "--json")
    assert json_doc(empty, "action.schema.json")["count"] == 0

    assert target.claim("s:1").fencing_token == first["s:1"].fencing_token + 1
    # released, never "freed": still claimable
    assert target.claim("r:1").fencing_token == released.fencing_token + 1


# forget ----------------------------------------------------------------------------------


def test_forget(target: Target) -> None:
    target.completed("f:done", result="first", fingerprint=FINGERPRINT)
    failed = target.failed("f:failed", error="bad input")
    busy = target.claim("f:busy")

    done = on(target.url, "forget", "f:done")
    assert done.exit_code == 0, done.stderr
    assert done.stdout.strip() == (
        "forgot 'f:done' (it was completed): its next delivery runs the handler again"
    )
    assert target.get("f:done") is None
    assert listed(target.url, "--prefix", "f:done") == []
    again = target.claim("f:done", fingerprint="cd" * 32)  # any payload: the key is new
    assert again.attempt == 1
    assert again.takeover is False

    as_json = on(target.url, "forget", "f:failed", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    assert json_doc(as_json, "action.schema.json") == {
        "action": "forget", "store": target.store.url,
        "store_source": "--store", "dry_run": False, "count": 1,
        "keys": ["f:failed"], "record": failed.to_json(), "entity": None,
    }  # fmt: skip
    assert target.get("f:failed") is None
    assert target.claim("f:failed").attempt == 1

    refused = on(target.url, "forget", "f:busy")
    assert refused.exit_code == ExitCode.REFUSED
    assert "is in progress" in refused.stderr and "--force" in refused.stderr
    record = target.get("f:busy")
    assert record is not None and record.owner == busy.owner
    forced = on(target.url, "forget", "f:busy", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert forced.stdout.startswith("forgot 'f:busy' (it was in_progress)")
    assert target.get("f:busy") is None
    with pytest.raises(idemctl.LeaseLost):
        target.store.complete("f:busy", busy.owner, busy.fencing_token, None)

    missing = on(target.url, "forget", "f:missing")
    assert missing.exit_code == ExitCode.KEY_NOT_FOUND
    assert "no record for key 'f:missing'" in missing.stderr


# purge -----------------------------------------------------------------------------------


def test_purge(target: Target) -> None:
    done = [target.completed(f"x:{n}") for n in range(3)]
    target.completed("k:kept")
    target.claim("k:busy")
    target.failed("x:failed")
    for name in ("x:0", "x:1", "x:2", "x:failed"):
        target.expire_retention(name)  # past retention: the store's clock set, not waited for
    # SQLite and PostgreSQL keep records past retention until purged. Redis drops them by
    # TTL at once. DynamoDB's TTL deletes them some time later (moto's never does), so
    # purge finds them there.
    expected = 0 if KINDS[target.name].family == "redis" else 4

    def past() -> int:  # --exact: DynamoDB's own counts do not know
        stats = json_doc(on(target.url, "stats", "--json", "--exact"), "stats.schema.json")
        return int(stats["past_retention"])

    assert past() == expected
    dry = on(target.url, "purge", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout == ""
    assert (
        f"dry run: {expected} record(s) past retention would be purged, on {target.store.url}"
        in dry.stderr
    )
    dry_json = on(target.url, "purge", "--dry-run", "--json")
    assert json_doc(dry_json, "action.schema.json") == {
        "action": "purge", "store": target.store.url,
        "store_source": "--store", "dry_run": True, "count": expected,
        "keys": None, "record": None, "entity": None,
    }  # fmt: skip
    assert past() == expected  # the dry runs deleted nothing
    recent = on(target.url, "purge", "--older-than", "100ms", "--dry-run", "--json")
    assert json_doc(recent, "action.schema.json")["count"] == expected  # ended 300ms ago
    assert on(target.url, "purge", "--older-than", "1h", "--yes").exit_code == 0
    assert past() == expected  # retention ended less than an hour ago

    # Past retention a key is as if never seen, though it is still stored.
    assert listed(target.url) == ["k:busy", "k:kept"]
    for args in (["inspect", "x:0"], ["forget", "x:0"], ["unlock", "x:0"]):
        gone = on(target.url, *args)
        assert gone.exit_code == ExitCode.KEY_NOT_FOUND, gone.stdout + gone.stderr
        assert "no record for key 'x:0'" in gone.stderr
    assert past() == expected  # forget left it for purge

    if expected > 1:
        declined = on(target.url, "purge", input="n\n")
        assert declined.exit_code == ExitCode.REFUSED
        assert f"Delete {expected} record(s) past retention on {target.store.url}?" in (
            declined.stderr
        )
        assert "nothing changed: not confirmed" in declined.stderr
        assert past() == expected
        agreed = on(target.url, "purge", "--rate", "1000", input="y\n")  # paced, whole
        assert agreed.exit_code == 0, agreed.stderr
        assert agreed.stdout.strip() == (
            f"purged {expected} record(s) past retention on {target.store.url}"
        )
    else:
        nothing = on(target.url, "purge", "--yes", "--json")
        assert nothing.exit_code == 0, nothing.stderr
        assert json_doc(nothing, "action.schema.json")["count"] == 0
    assert past() == 0
    # What was live is still there.
    assert listed(target.url) == ["k:busy", "k:kept"]
    # --exact: Redis's index counts a record up to a second past its TTL (lua/_lib.lua).
    stats = json_doc(on(target.url, "stats", "--json", "--exact"), "stats.schema.json")
    assert stats["total"] == 2

    # Purged (or dropped by TTL), the record is gone; its fencing counter never goes back:
    # the key starts again above every token it had.
    again = target.claim("x:0")
    assert again.attempt == 1 and again.fencing_token > done[0].fencing_token


# Usage errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["unlock"], "give a KEY, or --stale"),
        (["unlock", "k", "--stale"], "give a KEY, or --stale"),
        (["unlock", "--stale", "--force"], "--force"),
        (["unlock", "k", "--yes"], "goes with --stale"),
        (["unlock", "k", "--older-than", "5m"], "goes with --stale"),
        (["unlock", "--stale", "--older-than", "soon"], "not a duration"),
        (["list", "--older-than", "5 parsecs"], "not a duration"),
        (["list", "--older-than", "-5s"], "not a duration"),
        (["list", "--older-than", "-5"], "must not be negative"),
        (["list", "--status", "bogus"], "bogus"),
        (["list", "--limit", "-1"], "--limit"),
        (["purge", "--older-than", "later"], "not a duration"),
        (["inspect"], "KEY"),
        (["forget"], "KEY"),
        (["inspect", ""], "empty"),
        (["forget", "k" * 513], "at most 512 bytes"),
        (["nonsense"], "nonsense"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    db = tmp_path / "never.db"
    result = on(f"sqlite:///{db}", *args)
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert says in result.stderr
    assert result.stdout == ""
    assert not db.exists()  # rejected before the store was opened


# memory:// -------------------------------------------------------------------------------


def test_memory_store_commands() -> None:
    url = "memory://"
    init = on(url, "init")
    assert init.exit_code == 0
    assert "memory:// is up to date; nothing changed (memory store needs no provisioning)" in (
        init.stderr
    )
    init_json = on(url, "init", "--json")
    assert json_doc(init_json, "init.schema.json") == {
        "store": url, "store_source": "--store", "dry_run": False, "changed": False,
        "statements": [],
        "notes": ["memory store needs no provisioning"],
    }  # fmt: skip

    doctor = on(url, "doctor", "--json")
    assert doctor.exit_code == 0
    document = json_doc(doctor, "doctor.schema.json")
    assert document["ok"] is True
    assert document["findings"][0] == {
        "name": "store", "ok": True, "level": "ok", "fix": None,
        "detail": "memory:// (from --store)",
    }  # fmt: skip
    assert "durability" in {f["name"] for f in document["findings"]}

    stats = on(url, "stats", "--json")
    assert json_doc(stats, "stats.schema.json")["total"] == 0
    empty = on(url, "list")
    assert empty.exit_code == 0
    assert empty.stdout == ""
    assert "no records match" in empty.stderr
    assert on(url, "list", "--json").stdout == ""
    missing = on(url, "inspect", "k")
    assert missing.exit_code == ExitCode.KEY_NOT_FOUND
    assert "no record for key 'k'" in missing.stderr


def test_store_from_the_environment() -> None:
    result = run(["doctor", "--json"], env={"IDEMCTL_STORE": "memory://"})
    assert result.exit_code == 0, result.stderr
    document = json_doc(result, "doctor.schema.json")
    assert (document["store"], document["store_source"]) == ("memory://", "IDEMCTL_STORE")
    assert result.stderr == store_line("memory://", "IDEMCTL_STORE")


def test_flags_beat_the_environment(tmp_path: Path) -> None:
    """--store, then --profile (on the root or the command), then IDEMCTL_STORE, then
    IDEMCTL_PROFILE or the file's store: and each run says which store and why."""
    prod, other = f"sqlite:///{tmp_path}/prod.db", f"sqlite:///{tmp_path}/other.db"
    config = tmp_path / "idemctl.yaml"
    config.write_text(f"store: {other}\nprofiles:\n  prod:\n    store: {prod}\n  bare: {{}}\n")
    for url in (prod, other):
        assert on(url, "init").exit_code == 0
    files = {"IDEMCTL_CONFIG": str(config)}
    env = {**files, "IDEMCTL_STORE": "memory://"}
    cases: list[tuple[list[str], dict[str, str | None], str, str]] = [
        (["--profile", "prod", "doctor"], env, prod, f"--profile prod in {config}"),  # seen
        (["doctor", "--profile", "prod"], env, prod, f"--profile prod in {config}"),
        (["--profile", "bare", "doctor"], env, other, f"{config}: store"),  # the file's own
        (["--store", other, "--profile", "prod", "doctor"], env, other, "--store"),
        (["doctor"], env, "memory://", "IDEMCTL_STORE"),
        (["doctor"], {**env, "IDEMCTL_PROFILE": "prod"}, "memory://", "IDEMCTL_STORE"),
        (
            ["doctor"],
            {**files, "IDEMCTL_PROFILE": "prod"},
            prod,
            f"IDEMCTL_PROFILE=prod in {config}",
        ),
        (["doctor"], files, other, f"{config}: store"),
    ]
    for args, environment, url, source in cases:
        result = run(["--json", *args], env=environment)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        document = json_doc(result, "doctor.schema.json")
        assert (document["store"], document["store_source"]) == (url, source), args
        assert document["findings"][0]["detail"] == f"{url} (from {source})"
        assert result.stderr == store_line(url, source), args
        shown = run(args, env=environment)
        assert shown.stderr.startswith(store_line(url, source)), args  # for humans too


@pytest.mark.clock
def test_every_command_names_its_store(target: Target) -> None:
    """On stderr always (stdout stays the command's own output); in every JSON document
    that has a "store", with where it came from."""
    target.completed("n:done")
    target.stale("n:stale")
    line = store_line(target.store.url)
    documents = {
        ("init",): "init.schema.json",
        ("stats",): "stats.schema.json",
        ("doctor",): "doctor.schema.json",
        ("unlock", "n:stale"): "action.schema.json",
        ("unlock", "--stale", "--dry-run"): "action.schema.json",
        ("forget", "n:done", "--dry-run"): "action.schema.json",
        ("purge", "--dry-run"): "action.schema.json",
    }
    for args, schema in documents.items():
        result = on(target.url, *args, "--json")
        assert result.stderr == line, (args, result.stderr)
        if result.exit_code == 0:  # doctor on the test's Redis finds appendonly off
            document = json_doc(result, schema)
            assert (document["store"], document["store_source"]) == (target.store.url, "--store")
    for args in (["list", "--json"], ["inspect", "n:done", "--json"]):  # records: stderr only
        result = on(target.url, *args)
        assert result.exit_code == 0 and result.stderr == line, (args, result.stderr)
        assert all("store_source" not in d for d in json_lines(result))
    for args in (["list"], ["inspect", "n:done"], ["stats"], ["forget", "n:done"]):
        result = on(target.url, *args)
        assert result.exit_code == 0, (args, result.stderr)
        assert result.stderr.startswith(line), (args, result.stderr)
        assert "store: " not in result.stdout


def test_version() -> None:
    plain = run(["version"])
    assert plain.exit_code == 0
    assert plain.stdout.strip() == idemctl.__version__
    as_json = run(["version", "--json"])
    assert as_json.exit_code == 0
    assert as_json.stdout.strip() == f'{{"version": "{idemctl.__version__}"}}'
