"""The manual's code, checked for what it did, and the examples, run as written (every
other block of the manual runs in tests/docs/test_blocks.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def doc_block(page: str) -> str:
    """The first python block of the manual's ``page``."""
    text = (REPO / "docs" / page).read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, f"no python block in docs/{page}"
    return match.group(1)


def doc_blocks(page: str) -> list[str]:
    """Every python block of the manual's ``page``, in order."""
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / page).read_text(), re.S)


def manual() -> str:
    """Every page of the manual, one after another."""
    return "\n".join(p.read_text() for p in sorted((REPO / "docs").rglob("*.md")))


def test_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(doc_block("guides/library.md"), "docs/guides/library.md", "exec"), namespace)
    assert namespace["charges"] == ["o-1001"]
    assert (tmp_path / "idemctl.db").exists()


def test_asyncio_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(doc_block("guides/asyncio.md"), "docs/guides/asyncio.md", "exec"), namespace)
    assert namespace["charges"] == ["o-1001"]
    assert (tmp_path / "idemctl.db").exists()


@pytest.mark.slow
def test_quickstart_charges_every_payment_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "quickstart.py"),
            "--payments",
            "80",
            "--workers",
            "4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every payment charged exactly once" in proc.stdout
    assert re.search(r"payments charged twice\s*│\s*0\s", proc.stdout)
    assert re.search(r"charges made\s*│\s*80\s", proc.stdout)


def test_postgres_transactional_example_runs(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    schema = f"docs_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("IDEMCTL_STORE", postgres_server.url(schema=schema))
    page = "guides/postgres-transactions.md"
    exec(compile(doc_block(page), f"docs/{page}", "exec"), {})
    with psycopg.connect(postgres_server.url().split("?")[0]) as conn:
        rows = conn.execute("SELECT order_id, cents FROM charges").fetchall()
        conn.execute("DROP TABLE charges")
    assert rows == [("o-1001", 2500)]  # the handler's effect, once, though it was called twice


def test_outbox_example_runs(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    schema = f"docs_{uuid.uuid4().hex[:8]}"
    database = postgres_server.url().split("?")[0]
    monkeypatch.setenv("IDEMCTL_STORE", postgres_server.url(schema=schema))
    monkeypatch.setenv("APP_DATABASE", database)
    block = doc_block("concepts/outbox.md")
    namespace: dict[str, Any] = {}
    exec(compile(block.replace('schema="idem"', f'schema="{schema}"'), "docs", "exec"),
         namespace)  # fmt: skip
    with psycopg.connect(database) as conn:
        orders = conn.execute("SELECT id, cents FROM orders").fetchall()
        events = conn.execute(
            f'SELECT id, aggregatetype, aggregateid, type, payload FROM "{schema}".outbox'
        ).fetchall()
        conn.execute("DROP TABLE orders")
    assert orders == [("o-1001", 2500)]
    assert events == [
        (namespace["event_id"], "order", "o-1001", "OrderPlaced", {"id": "o-1001", "cents": 2500})
    ]


HTTP_GUIDE = "guides/http.md"
KEY = {"Idempotency-Key": '"k-1"'}


def test_http_starlette_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(doc_blocks(HTTP_GUIDE)[0], "docs/guides/http.md", "exec"), namespace)
    assert namespace["charged"] == ["o-1"]  # the block checks the replay itself
    assert (tmp_path / "idemctl.db").exists()


def test_http_fastapi_block_runs(redis_server: Any) -> None:
    from starlette.testclient import TestClient

    url = redis_server.url(query=f"prefix=docs-{uuid.uuid4().hex[:8]}:")
    block = doc_blocks(HTTP_GUIDE)[1]
    assert "redis://127.0.0.1:6379/0" in block
    namespace: dict[str, Any] = {}
    exec(compile(block.replace("redis://127.0.0.1:6379/0", url), "docs", "exec"), namespace)
    with TestClient(namespace["app"]) as client:
        first = client.post("/charges", json={"id": "o-1"}, headers=KEY)
        again = client.post("/charges", json={"id": "o-1"}, headers=KEY)
        other = client.post("/charges", json={"id": "o-2"}, headers=KEY)
    assert first.status_code == 201 and first.json()["order"] == "o-1"
    assert again.content == first.content and again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422


def test_http_flask_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_flask"}
    exec(compile(doc_blocks(HTTP_GUIDE)[2], "docs/guides/http.md", "exec"), namespace)
    client = namespace["app"].test_client()
    first = client.post("/charges", json={"order": "o-1"}, headers=KEY)
    again = client.post("/charges", json={"order": "o-1"}, headers=KEY)
    missing = client.post("/charges", json={"order": "o-1"})
    assert first.status_code == again.status_code == 201 and again.data == first.data
    assert missing.status_code == 400 and namespace["charged"] == ["o-1"]


def test_http_django_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's WSGI handler stood in for by a WSGI app: what the block does is wrap
    whatever get_wsgi_application() returns. Its DJANGO_SETTINGS_MODULE is set here first,
    so that it goes with the test (a worker's later servers would inherit it)."""
    import types

    from werkzeug.test import Client

    views: list[int] = []

    def handler(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        views.append(environ["idemctl.attempt"].fencing_token)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"charged"]

    wsgi = types.ModuleType("django.core.wsgi")
    wsgi.get_wsgi_application = lambda: handler  # type: ignore[attr-defined]
    for name in ("django", "django.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "django.core.wsgi", wsgi)
    monkeypatch.setenv("IDEMCTL_STORE", f"sqlite:///{tmp_path}/django.db")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "shop.settings")
    namespace: dict[str, Any] = {}
    exec(compile(doc_blocks(HTTP_GUIDE)[3], "docs/guides/http.md", "exec"), namespace)
    client = Client(namespace["application"])
    answers = [client.post("/charges", data=b"{}", headers=KEY) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201] and len(views) == 1
    assert answers[1].headers["Idempotent-Replayed"] == "true"


def test_exit_code_table_is_the_code_table() -> None:
    from idemctl.cli.exitcodes import MEANINGS

    page = (REPO / "docs" / "reference" / "exit-codes.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.*) \|$", page, re.M))
    assert {
        int(code): text.replace("`", "'").replace("'--force'", "--force")
        for code, text in rows.items()
    } == {int(code): meaning for code, meaning in MEANINGS.items()}


def test_manual_shows_every_command_and_global_option() -> None:
    from idemctl.cli import app
    from idemctl.cli.lazy import load_all

    load_all()
    text = manual()
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}  # type: ignore[union-attr]
    assert commands >= {"init", "inspect", "list", "stats", "doctor", "unlock", "forget", "purge"}
    for name in commands:
        assert f"`idemctl {name}" in text, f"the manual lacks a line on idemctl {name}"
        example = re.compile(rf"^\$ .*idemctl .*\b{name}\b", re.M)
        assert example.search(text) or name == "version", f"no example of {name}"
    for group in app.registered_groups:
        for sub in group.typer_instance.registered_commands:
            name = f"{group.name} {sub.name or sub.callback.__name__}"  # type: ignore[union-attr]
            assert f"`idemctl {name}" in text, f"the manual lacks a line on idemctl {name}"
            assert re.search(rf"^\$ .*idemctl .*\b{name}\b", text, re.M), f"no example of {name}"
    for option in ("--store", "--config", "--profile", "--json", "-v", "--no-color"):
        assert f"`{option}" in text


def test_orders_example_commits_the_order_and_its_events_together(postgres_server: Any) -> None:
    """examples/orders.py as `consume --transactional` runs it: the order row, the key and
    two outbox events commit together; a duplicate adds nothing; a malformed order fails
    for good and leaves nothing. In a database of its own: the example's table is `orders`."""
    import json

    from idemctl import open_store, run
    from idemctl.consume import Event, adapt

    sys.path.insert(0, str(REPO / "examples"))
    try:
        import orders  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(REPO / "examples"))
    db = f"orders_{uuid.uuid4().hex[:8]}"
    with postgres_server.connect() as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    try:
        with postgres_server.connect(db) as conn:
            conn.execute("CREATE TABLE orders (id text PRIMARY KEY, customer text, cents bigint)")
            store = open_store(postgres_server.url(db))
            store.provision()
            handler = adapt(orders.place)

            def deliver(key: str, order: dict[str, Any]) -> Any:
                event = Event("orders", 0, 0, None, json.dumps(order).encode(), (), None)
                return run(store, key, lambda ctx: handler(event, ctx), transactional=True)

            try:
                first = deliver("o-1", {"id": "o-1", "customer": "ada", "cents": 2500})
                again = deliver("o-1", {"id": "o-1", "customer": "ada", "cents": 2500})
                bad = deliver("o-2", {"customer": "bob"})
            finally:
                store.close()
            placed = conn.execute("SELECT id, cents FROM orders").fetchall()
            events = conn.execute(
                "SELECT id, aggregateid, type, payload, headers FROM idem.outbox ORDER BY seq"
            ).fetchall()
    finally:
        with postgres_server.connect() as admin:
            admin.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
    assert (first.outcome, again.outcome, bad.outcome) == ("executed", "replayed", "error")
    assert not bad.retriable
    assert placed == [("o-1", 2500)]
    assert [(e[1], e[2]) for e in events] == [("o-1", "OrderPlaced"), ("o-1", "PaymentRequested")]
    assert events[0][3] == {"id": "o-1", "customer": "ada", "cents": 2500}
    assert events[1][4] == {"causation-id": str(events[0][0])}
    assert first.result == {"placed": "o-1", "event": str(events[0][0])}


def test_ordering_example_runs(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    schema = f"docs_{uuid.uuid4().hex[:8]}"
    url = postgres_server.url(schema=schema)
    monkeypatch.setenv("IDEMCTL_STORE", url)
    exec(compile(doc_block("concepts/ordering.md"), "docs/concepts/ordering.md", "exec"), {})
    with psycopg.connect(postgres_server.url().split("?")[0]) as conn:
        rows = conn.execute("SELECT id, cents, seq FROM accounts").fetchall()
        conn.execute("DROP TABLE accounts")
    assert rows == [("a-7", 0, 11)]  # the late sequence 10 did not overwrite 11
    from idemctl import open_store

    with open_store(url) as store:
        entity = store.get_entity("account:a-7")
    assert entity is not None and (entity.sequence, entity.key) == (11, "ledger:a-7:11")


def test_the_two_commands_are_the_same_in_the_readme_and_the_manual() -> None:
    """scripts/check-install runs the README's first command; the manual shows the same."""

    def two_commands(text: str) -> str:
        section = text.split("The two commands\n", 1)[1]
        match = re.search(r"```bash\n(.*?)```", section, re.S)
        assert match, "no bash block under 'The two commands'"
        return match.group(1)

    readme = (REPO / "README.md").read_text()
    page = (REPO / "docs" / "getting-started" / "quickstart.md").read_text()
    assert two_commands(page) == two_commands(readme)


def test_the_readme_is_a_front_page_that_links_into_the_manual() -> None:
    """At most 250 lines: what it is, the two commands, short examples, the stores; every
    link into docs/ goes to a page that exists."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "## The two commands\n" in readme
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), f"README.md links to {link}, which is not there"
