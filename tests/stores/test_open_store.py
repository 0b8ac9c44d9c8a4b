"""open_store(url): schemes, URL errors, missing drivers and SQLite provisioning."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idemctl import backends
from idemctl.errors import ConfigError, MissingDriver, NotProvisioned, StoreUnavailable
from idemctl.model import Acquired, Completed
from idemctl.stores import open_store
from idemctl.stores.base import Store
from idemctl.stores.memory import MemoryStore
from idemctl.stores.sqlite import SQLiteStore


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        conn.close()
    return {name for (name,) in rows}


# Schemes ---------------------------------------------------------------------------------


def test_memory_url_opens_a_working_memory_store() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert isinstance(store, Store)
    outcome = store.claim("k1")
    assert isinstance(outcome, Acquired)
    store.complete("k1", outcome.owner, outcome.fencing_token, {"ok": True})
    again = store.claim("k1")
    assert isinstance(again, Completed)
    assert again.record.result == {"ok": True}


def test_every_memory_url_opens_a_new_empty_store() -> None:
    first = open_store("memory://")
    first.claim("k1")
    assert open_store("memory://").get("k1") is None


def test_memory_url_options_set_lease_and_retention() -> None:
    store = open_store("memory://?lease=5s&retention=1h")
    assert store.default_lease == 5.0
    assert store.default_retention == 3600.0


def test_sqlite_absolute_path(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    url = f"sqlite:///{db}"  # four slashes: the path itself starts with '/'
    assert url.startswith("sqlite:////")
    store = open_store(url)
    try:
        assert isinstance(store, SQLiteStore)
        outcome = store.claim("k1")
        assert isinstance(outcome, Acquired)
        store.complete("k1", outcome.owner, outcome.fencing_token, [1, 2])
    finally:
        store.close()
    assert db.exists()
    # A second opening sees what the first stored.
    reopened = open_store(url)
    try:
        again = reopened.claim("k1")
        assert isinstance(again, Completed)
        assert again.record.result == [1, 2]
    finally:
        reopened.close()


def test_sqlite_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///./x.db")
    try:
        assert isinstance(store.claim("k1"), Acquired)
    finally:
        store.close()
    assert (tmp_path / "x.db").exists()
    assert {"idem_keys", "idem_meta"} <= tables(tmp_path / "x.db")


def test_sqlite_options_are_applied(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.db?lease=2m&retention=1d&synchronous=normal")
    try:
        assert store.default_lease == 120.0
        assert store.default_retention == 86400.0
        durability = next(f for f in store.check() if f.name == "durability")
        assert not durability.ok
        assert "synchronous=normal" in durability.detail
    finally:
        store.close()


def test_scheme_is_case_insensitive() -> None:
    assert isinstance(open_store("MEMORY://"), MemoryStore)


# URL errors ------------------------------------------------------------------------------


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("nosuch://host/db")
    message = str(info.value)
    assert "'nosuch'" in message
    assert "sqlite://" in message
    assert "memory://" in message


def test_missing_scheme_separator_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a store URL"):
        open_store("idemctl.db")


def test_sqlite_url_with_a_host_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=re.escape("sqlite:///relative/path.db")):
        open_store("sqlite://host/x.db")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///"])
def test_sqlite_url_without_a_path_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        open_store(url)


@pytest.mark.parametrize("url", ["memory://?leese=5s", "sqlite:///{tmp}/x.db?leese=5s"])
def test_unknown_url_option_is_a_config_error_naming_it(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="leese"):
        open_store(url.format(tmp=tmp_path))


def test_sqlite_url_with_unknown_option_creates_no_database(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="leese"):
        open_store(f"sqlite:///{tmp_path}/x.db?leese=5s")
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    "url",
    [
        "memory://?lease=soon",
        "memory://?retention=-1s",
        "sqlite:///{tmp}/x.db?auto_provision=maybe",
    ],
)
def test_bad_url_option_value_is_a_config_error(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        open_store(url.format(tmp=tmp_path))


@pytest.mark.parametrize(
    "url",
    [
        "nosuch://user:s3cret@host/0",
        "memory://user:s3cret@host?bogus=1",
        "memory://user:s3cret@host?lease=soon",
    ],
)
def test_password_in_a_bad_url_never_appears_in_the_error(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert "s3cret" not in str(info.value)


def test_password_in_a_bad_sqlite_url_never_appears_in_the_error() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("sqlite://user:s3cret@host/x.db")
    assert "s3cret" not in str(info.value)


def test_password_in_a_url_without_slashes_never_appears_in_the_error() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("redis:/user:s3cret@host:6379/0")
    assert "s3cret" not in str(info.value)


def test_unparseable_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        open_store("memory://user:s3cret@[::1/0")


def test_store_url_is_redacted() -> None:
    store = open_store("memory://user:s3cret@host?lease=5s")
    assert "s3cret" not in store.url
    assert "***" in store.url
    assert "s3cret" not in repr(store)


# Missing drivers -------------------------------------------------------------------------


Join = Callable[[str, str, str], None]


@pytest.fixture
def join() -> Iterator[Join]:
    """Registers a backend ``scheme`` (its store, its driver; its extra named as the scheme)
    for the test only."""
    joined: list[backends.Backend] = []

    def register(scheme: str, store: str, driver: str) -> None:
        joined.append(backends.Backend(scheme, (scheme,), store, driver=driver, extra=scheme))
        backends.register(joined[-1])

    yield register
    for backend in joined:
        backends.unregister(backend)


def test_missing_driver_names_the_extra_to_install(join: Join) -> None:
    join("fake", "idemctl_tests_missing_module:X", "idemctl_tests_missing_module")
    with pytest.raises(MissingDriver) as info:
        open_store("fake://host/0")
    assert "pip install 'idemctl[fake]'" in str(info.value)
    assert isinstance(info.value, ConfigError)  # exit code 2, like any bad configuration


def test_backend_whose_driver_import_fails_gives_missing_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, join: Join
) -> None:
    # A backend module that exists but imports a driver package that is not installed.
    (tmp_path / "idemctl_tests_fake_backend.py").write_text(
        "import idemctl_tests_absent_driver.client\n\nclass FakeStore:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    join("fakedb", "idemctl_tests_fake_backend:FakeStore", "idemctl_tests_absent_driver")
    with pytest.raises(MissingDriver, match=r"pip install 'idemctl\[fakedb\]'"):
        open_store("fakedb://user:s3cret@host/0")


def test_other_missing_modules_are_not_disguised_as_a_missing_driver(join: Join) -> None:
    join("fake", "idemctl_tests_missing_backend_module:X", "some_other_driver")
    with pytest.raises(ModuleNotFoundError) as info:
        open_store("fake://host/0")
    assert not isinstance(info.value, MissingDriver)


# SQLite: unavailable, provisioning --------------------------------------------------------


def test_sqlite_path_in_a_missing_directory_is_store_unavailable(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")  # opens on first use
    with pytest.raises(StoreUnavailable) as info:
        store.claim("k")
    assert "x.db" in str(info.value)
    assert not isinstance(info.value, sqlite3.Error)


def test_unprovisioned_sqlite_store_raises_not_provisioned_until_provisioned(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.db?auto_provision=0")
    try:
        with pytest.raises(NotProvisioned, match="idemctl init"):
            store.claim("k1")
        with pytest.raises(NotProvisioned):
            store.get("k1")
        with pytest.raises(NotProvisioned):
            store.stats()
        schema = next(f for f in store.check() if f.name == "schema")
        assert not schema.ok
        assert schema.fix == "run 'idemctl init'"

        done = store.provision()
        assert done.changed
        assert done.statements
        assert isinstance(store.claim("k1"), Acquired)
    finally:
        store.close()


def test_provision_twice_changes_nothing_the_second_time(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.db?auto_provision=0")
    try:
        first = store.provision()
        second = store.provision()
    finally:
        store.close()
    assert first.changed
    assert not second.changed
    assert second.statements == []


def test_auto_provisioned_store_needs_no_provisioning(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.db")
    try:
        store.get("anything")  # first use provisions
        again = store.provision()
    finally:
        store.close()
    assert not again.changed
    assert again.statements == []


def test_provision_dry_run_returns_the_ddl_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    store = open_store(f"sqlite:///{db}?auto_provision=0")
    try:
        plan = store.provision(dry_run=True)
        assert plan.dry_run
        assert not plan.changed
        assert any("CREATE TABLE" in s and "idem_keys" in s for s in plan.statements)
        assert any("CREATE TABLE" in s and "idem_meta" in s for s in plan.statements)
        assert tables(db) == set()
        with pytest.raises(NotProvisioned):
            store.claim("k1")
    finally:
        store.close()


def test_memory_store_needs_no_provisioning() -> None:
    plan = open_store("memory://").provision()
    assert not plan.changed
    assert plan.statements == []
