"""``idemctl.operate``: the operator's actions as library calls, the same for every front
end and every layout. On a real SQLite store, and on a Powertools table of a fake backend
(``PowertoolsTable``'s abstract part kept in a dict) to show a layout is a kind of target,
not a branch in each action."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from idemctl import operate
from idemctl.errors import ConfigError, EntityNotFound, KeyNotFound, OptionError, Refused
from idemctl.model import Acquired, Finding, Record, Status
from idemctl.operate import look
from idemctl.operate.documents import action as action_document
from idemctl.powertools.model import COMPLETED, INPROGRESS, PowertoolsRecord, State
from idemctl.powertools.table import Delete, PowertoolsTable, holds
from tests.backends import expire_lease


@pytest.fixture
def target(tmp_path: Path) -> Iterator[operate.Target]:
    with operate.open_target(f"sqlite:///{tmp_path}/keys.db", auto_provision=True) as opened:
        assert isinstance(opened, operate.StoreTarget)
        opened.store.provision()
        yield opened


def test_records_come_a_page_at_a_time_up_to_the_limit_and_the_cursor_goes_on(
    target: operate.StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(7):
        target.store.claim(f"order-{i}")
    monkeypatch.setattr(look, "PAGE", 2)
    pages = list(operate.records(target, operate.Query(prefix="order-"), limit=5))
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert [r.key for p in pages for r in p.items] == [f"order-{i}" for i in range(5)]
    rest = list(operate.records(target, operate.Query(prefix="order-"), 0, pages[-1].cursor))
    assert [r.key for p in rest for r in p.items] == ["order-5", "order-6"]
    assert rest[-1].cursor is None


def test_a_query_the_layout_cannot_answer_names_its_option(target: operate.StoreTarget) -> None:
    with pytest.raises(OptionError) as both:
        list(operate.records(target, operate.Query(stale=True, released=True), 10))
    assert both.value.option == "released"
    with pytest.raises(OptionError) as blocked:
        list(operate.records(target, operate.Query(blocked=True), 10))
    assert blocked.value.option == "blocked"


def test_dry_runs_judge_as_the_action_does_and_change_nothing(
    target: operate.StoreTarget,
) -> None:
    claimed = target.store.claim("live", lease=300)
    assert isinstance(claimed, Acquired)
    with pytest.raises(Refused):  # a live lease, as unlock refuses it
        operate.unlock(target, "live", dry_run=True)
    preview = operate.unlock(target, "live", force=True, dry_run=True)
    assert preview.dry_run and preview.keys == ["live"] and preview.record is not None
    after = target.store.get("live")
    assert after is not None and after.owner == claimed.owner  # still held
    with pytest.raises(Refused):  # in progress, as forget refuses it
        operate.forget(target, "live", dry_run=True)
    with pytest.raises(KeyNotFound):
        operate.unlock(target, "missing", dry_run=True)
    with pytest.raises(EntityNotFound):
        operate.forget_entity(target, "acct-1", dry_run=True)
    done = operate.unlock(target, "live", force=True)
    assert not done.dry_run and isinstance(done.record, Record) and done.record.owner is None
    document = action_document.of(done, {"store": target.url, "store_source": "test"})
    assert document["action"] == "unlock" and document["keys"] == ["live"]


def test_a_bulk_action_previews_then_acts_and_tells_what_was_left_alone(
    target: operate.StoreTarget,
) -> None:
    for key in ("a", "b"):
        target.store.claim(key, lease=300)
        expire_lease(target.store, key)
    found = operate.unlock_stale(target, dry_run=True)
    assert found.keys == ["a", "b"] and found.words.verb == "freed"
    target.store.unlock("b")  # freed meanwhile by someone else
    done = operate.unlock_stale(target, previewed=found.keys)
    assert done.keys == ["a"] and done.left_alone == ["b"]
    with pytest.raises(ConfigError):
        operate.purge(target, rate=0.5)


def test_stats_count_keys_and_entities(target: operate.StoreTarget) -> None:
    target.store.claim("x")
    counts = operate.stats(target)
    assert isinstance(counts, operate.Counts)
    assert counts.stats.by_status[Status.IN_PROGRESS] == 1 and counts.entities == 0


# A layout joins as a kind of target --------------------------------------------------------


class DictTable(PowertoolsTable):
    """A Powertools table whose items live in a dict: the backend's part only."""

    url = "fake://table?layout=powertools"

    def __init__(self, records: list[PowertoolsRecord]) -> None:
        self.items = {r.key: r for r in records}

    def _read(self, key: str) -> PowertoolsRecord | None:
        return self.items.get(key)

    def _items(
        self, prefix: str | None, limit: int | None = None
    ) -> Iterator[list[PowertoolsRecord]]:
        yield [r for k, r in sorted(self.items.items()) if k.startswith(prefix or "")]

    def _delete(self, d: Delete) -> tuple[bool, PowertoolsRecord | None]:
        old = self.items.get(d.key)
        if old is None or not holds(d.rule, old, d.now, d.cutoff):
            return False, old
        del self.items[d.key]
        return True, old

    def check(self) -> list[Finding]:
        return [Finding("table", True, "a dict")]


def powertools_target() -> operate.PowertoolsTarget:
    now = datetime.now(UTC)
    later, earlier = now + timedelta(hours=1), now - timedelta(minutes=5)
    return operate.PowertoolsTarget(
        DictTable(
            [
                PowertoolsRecord("fn#done", COMPLETED, later, None),
                PowertoolsRecord("fn#stale", INPROGRESS, later, earlier),
                PowertoolsRecord("fn#live", INPROGRESS, later, later),
            ]
        )
    )


def test_a_powertools_table_answers_the_same_calls_with_its_states() -> None:
    target = powertools_target()
    stale = [r.key for p in operate.records(target, operate.Query(stale=True), 0) for r in p.items]
    assert stale == ["fn#stale"]
    counts = operate.stats(target)
    assert not isinstance(counts, operate.Counts)
    assert counts.by_state[State.COMPLETED] == 1 and counts.total == 3
    preview = operate.unlock_stale(target, dry_run=True)
    assert preview.keys == ["fn#stale"] and preview.words.verb == "deleted"
    with pytest.raises(Refused):  # a live invocation, judged as the delete would be
        operate.unlock(target, "fn#live", dry_run=True)
    assert operate.forget(target, "fn#done").record is not None
    assert operate.inspect(target, "fn#live").key == "fn#live"
    with pytest.raises(KeyNotFound):
        operate.inspect(target, "fn#done")


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (lambda t: operate.inspect_entity(t, "acct-1"), "entity"),
        (lambda t: operate.forget_entity(t, "acct-1"), "entity"),
        (lambda t: list(operate.entities(t, None, 10)), "entities"),
        (lambda t: operate.stats(t, exact=True), "exact"),
        (lambda t: list(operate.records(t, operate.Query(released=True), 10)), "released"),
        (lambda t: list(operate.records(t, operate.Query(older_than=60.0), 10)), "older_than"),
    ],
)
def test_what_a_powertools_table_has_not_is_refused_by_option(call, option: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError) as refused:
        call(powertools_target())
    assert refused.value.option == option
    assert "does not apply to a Powertools table" in refused.value.message


def test_init_previews_then_provisions_once(tmp_path: Path) -> None:
    """``operate.init`` is what ``idemctl init`` calls: a dry run changes nothing, the run
    provisions, a second run finds nothing to do."""
    from idemctl.stores import open_store

    with open_store(f"sqlite:///{tmp_path}/fresh.db") as store:
        plan = operate.init(store, dry_run=True)
        assert plan.dry_run and plan.statements and not plan.changed
        assert operate.init(store).changed  # the dry run had created nothing
        assert store.get("k") is None
        assert not operate.init(store).changed


def test_outbox_calls_refuse_a_store_without_an_outbox(tmp_path: Path) -> None:
    """Replay and purge check the outbox table before anything else (the CLI and the
    console both come through here)."""
    from idemctl.outbox.table import Selection
    from idemctl.stores import open_store

    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        store.provision()
        with pytest.raises(ConfigError, match="outbox"):
            operate.outbox_replay(store, Selection(aggregatetype="order"))
        with pytest.raises(ConfigError, match="outbox"):
            operate.outbox_purge(store, 0.0, dry_run=True)
