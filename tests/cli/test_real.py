"""idemctl as an operator runs it: `python -m idemctl` in real subprocesses, on the real
stores (SQLite files, redis-server, a Redis cluster, PostgreSQL, DynamoDB on moto's server).

Each subprocess costs a Python start-up, so independent runs go in parallel (``run_all``).
Every process started here is stopped by its PID in a ``finally``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

from idemctl import Acquired, Busy, __version__, open_store
from idemctl.config import load_config
from idemctl.errors import ConfigError
from tests.backends import (
    BACKENDS,
    BY_URL,
    expire_lease,
    expire_retention,
    unique_prefix,
    unique_schema,
)
from tests.fixtures_redis import REDIS_PASSWORD
from tests.polling import wait_until
from tests.servers import ctrl_c_reaches_it, free_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SCHEMAS = ROOT / "schemas"
PARALLEL = 4
"""Subprocesses run at once by ``run_all``: most of their time is start-up and waiting."""

Result = subprocess.CompletedProcess[str]


# Running idemctl ---------------------------------------------------------------------------


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any IDEMCTL_* setting, plus ``extra``. A wide
    terminal, so that tables are not folded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


def idemctl(
    *args: str, cwd: Path, env: dict[str, str] | None = None, input: str | None = None
) -> Result:
    """``python -m idemctl ARGS`` in ``cwd`` (always a test's own directory: the default
    store is ./idemctl.db). Without ``input`` its stdin is at EOF."""
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        cwd=cwd, env=cli_env(env), input=input, capture_output=True, text=True, timeout=120,
        check=False, stdin=None if input is not None else subprocess.DEVNULL,
    )  # fmt: skip


def run_all(
    calls: Sequence[Sequence[str]],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    parallel: int = PARALLEL,
) -> list[Result]:
    """Several independent ``idemctl`` runs at once; results in the order of ``calls``."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda args: idemctl(*args, cwd=cwd, env=env), calls))


def show(result: Result) -> str:
    """A run, for assertion messages."""
    return (
        f"\n$ idemctl {' '.join(result.args[3:])}\nexit {result.returncode}\n"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    )


def one_error_line(result: Result) -> str:
    """The single ``error: ...`` line a failing command prints on stderr (after the
    ``store: URL (from SOURCE)`` line, when it got as far as opening the store)."""
    lines = result.stderr.strip().splitlines()
    if lines and re.fullmatch(r"store: \S+ \(from .+\)", lines[0]):
        lines = lines[1:]
    assert len(lines) == 1, show(result)
    assert lines[0].startswith("error: "), show(result)
    return lines[0]


def ndjson(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def listed_keys(result: Result) -> list[str]:
    assert result.returncode == 0, show(result)
    return [r["key"] for r in ndjson(result.stdout)]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# JSON schemas ------------------------------------------------------------------------------


def _registry() -> Registry:
    resources = [
        (
            f"https://idemctl.dev/schemas/{path.name}",
            Resource.from_contents(json.loads(path.read_text(encoding="utf-8"))),
        )
        for path in SCHEMAS.glob("*.schema.json")
    ]
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(
        schema, registry=REGISTRY, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def check_schema(document: Any, name: str) -> None:
    errors = [e.message for e in validator(name).iter_errors(document)]
    assert errors == [], f"{name}: {errors}\n{document}"


# SQLite stores with records ---------------------------------------------------------------


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def tokens(url: str, *keys: str) -> dict[str, int]:
    """The fencing tokens of ``keys`` as the store at ``url`` holds them now."""
    with open_store(url) as store:
        records = {key: store.get(key) for key in keys}
    return {key: r.fencing_token for key, r in records.items() if r is not None}


def seed(
    url: str,
    *,
    stale: Sequence[str] = (),
    live: Sequence[str] = (),
    completed: Sequence[str] = (),
    failed: Sequence[str] = (),
    past_retention: Sequence[str] = (),
) -> None:
    """Records in the store at ``url``, made through the library: stale = in progress with
    an expired lease; live = in progress, 60 s lease left; past_retention = completed with
    a retention that has ended (kept by SQLite and PostgreSQL until purged)."""
    with open_store(url) as store:
        store.provision()
        for key in stale:
            assert isinstance(store.claim(key, lease=60), Acquired)
            expire_lease(store, key)  # the store's clock set, not waited for
        for key in live:
            assert isinstance(store.claim(key, lease=60), Acquired)
        for key in completed:
            held = store.claim(key, lease=60)
            assert isinstance(held, Acquired)
            store.complete(key, held.owner, held.fencing_token, {"done": key})
        for key in failed:
            held = store.claim(key, lease=60)
            assert isinstance(held, Acquired)
            store.fail(key, held.owner, held.fencing_token, "card declined", retriable=False)
        for key in past_retention:
            held = store.claim(key, lease=60)
            assert isinstance(held, Acquired)
            store.complete(key, held.owner, held.fencing_token, None, retention=60)
            expire_retention(store, key)


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, str]:
    """A working directory and the URL of a SQLite file in it (not created yet)."""
    return tmp_path, sqlite_url(tmp_path / "keys.db")


# Processes started by tests ------------------------------------------------------------------


class Proc:
    """A child process whose stdout lines arrive on a queue (read by a thread) and whose
    stderr is collected, so that no read can block a test for ever."""

    def __init__(self, args: list[str], **kwargs: Any) -> None:
        self.popen = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=ctrl_c_reaches_it, **kwargs,  # noqa: PLW1509 - it only sets a signal
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        self.err = bytearray()
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read_out(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace")
            self.out.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.popen.stderr is not None
        while chunk := os.read(self.popen.stderr.fileno(), 4096):
            self.err += chunk

    def line(self, timeout: float = 60.0) -> str:
        """The next line it prints; fails if it exits or stays silent for ``timeout``."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"pid {self.pid} printed nothing in {timeout}s; stderr:\n{self.stderr}")
        if line is None:
            pytest.fail(f"pid {self.pid} exited ({self.popen.wait()}); stderr:\n{self.stderr}")
        return line

    def wait_stderr(self, text: str, timeout: float = 60.0) -> None:
        def printed() -> bool:
            if text in self.stderr:
                return True
            if self.popen.poll() is not None:
                self._threads[1].join(10)  # the reader copies the last bytes, up to EOF
                assert text in self.stderr, (
                    f"pid {self.pid} exited without printing {text!r}:\n{self.stderr}"
                )
            return False

        wait_until(printed, f"pid {self.pid} printing {text!r}", timeout, 0.02,
                   detail=lambda: self.stderr)  # fmt: skip

    def send(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text.encode())
        self.popen.stdin.flush()

    def wait(self, timeout: float = 60.0) -> int:
        code = self.popen.wait(timeout)
        for t in self._threads:
            t.join(timeout)
        return code

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return self.err.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL by PID, and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(30)
        if self.popen.stdin is not None:
            self.popen.stdin.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    """Starts processes for a test; kills (SIGKILL, by PID) whichever still runs after it."""
    started: list[Proc] = []

    def start(args: list[str], **kwargs: Any) -> Proc:
        proc = Proc(args, **kwargs)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


# 1. The acceptance scenario on every real store -----------------------------------------

WORKER = """
import json, sys, time
from idemctl import Acquired, open_store

url, key, live = sys.argv[1:4]
store = open_store(url)
held = {}
for k in (key, live):
    outcome = store.claim(k, lease=60)
    assert isinstance(outcome, Acquired), outcome
    held[k] = outcome
print(json.dumps({"owner": held[key].owner, "token": held[key].fencing_token}), flush=True)
sys.stdin.readline()
# A heartbeat with a short lease: once this process dies, the key is stale in a second.
expires = store.extend(key, held[key].owner, held[key].fencing_token, lease=1.0)
print(json.dumps({"lease_expires_at": expires.timestamp()}), flush=True)
time.sleep(600)
"""

REAL_STORES = BY_URL


@pytest.mark.parametrize("store_name", REAL_STORES)
def test_killed_worker_stale_lease_is_listed_and_freed(
    store_name: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    spawn: Callable[..., Proc],
) -> None:
    backend = BACKENDS[store_name](request)
    backend.reset()  # PostgreSQL and DynamoDB: provisioned before the worker opens the URL
    url = backend.url
    key, live = f"order-{uuid.uuid4().hex[:8]}", f"live-{uuid.uuid4().hex[:8]}"

    worker = spawn([sys.executable, "-c", WORKER, url, key, live], cwd=tmp_path)
    holding = json.loads(worker.line())
    owner, token = holding["owner"], holding["token"]

    # While its lease lasts, the key is not the operator's to free.
    refused = idemctl("--store", url, "unlock", key, cwd=tmp_path)
    assert refused.returncode == 6, show(refused)
    assert "live lease" in refused.stderr and "--force" in refused.stderr, show(refused)
    with open_store(url) as store:
        still = store.get(key)
    assert still is not None and still.owner == owner and still.fencing_token == token

    worker.send("go\n")
    expires = json.loads(worker.line())["lease_expires_at"]
    worker.kill()  # SIGKILL: no release, no cleanup
    worker.popen.wait()
    with open_store(url) as store:
        # Its heartbeat's lease, run out: the store's clock set, not waited for.
        assert store.get(key).lease_expires_at.timestamp() == pytest.approx(expires, abs=0.01)
        expire_lease(store, key)

    listed, as_json, live_refused = run_all(
        [
            ["--store", url, "list", "--stale"],
            ["--store", url, "list", "--stale", "--json"],
            ["--store", url, "unlock", live],
        ],
        cwd=tmp_path,
    )
    assert listed.returncode == 0, show(listed)
    row = next(line for line in listed.stdout.splitlines() if key in line)
    assert "in_progress (stale)" in row, show(listed)
    assert live not in listed.stdout, show(listed)  # the dead worker's other lease is live
    records = ndjson(as_json.stdout)
    assert [r["key"] for r in records] == [key], show(as_json)
    assert records[0]["status"] == "in_progress"
    assert records[0]["owner"] == owner
    assert records[0]["fencing_token"] == token
    for record in records:
        check_schema(record, "record.schema.json")
    assert live_refused.returncode == 6, show(live_refused)

    freed = idemctl("--store", url, "unlock", "--stale", "--yes", cwd=tmp_path)
    assert freed.returncode == 0, show(freed)
    assert key in freed.stdout and live not in freed.stdout, show(freed)
    assert "freed 1 lease(s)" in freed.stdout, show(freed)

    with open_store(url) as store:
        again = store.claim(key, lease=30)
        assert isinstance(again, Acquired), again
        assert again.fencing_token == token + 1
        assert again.owner != owner
        assert isinstance(store.claim(live, lease=30), Busy)  # left alone by unlock --stale


# 2. Every command, at least once, in a real process -------------------------------------


def test_version(tmp_path: Path) -> None:
    plain, as_json = run_all([["version"], ["--json", "version"]], cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout.strip() == __version__, show(plain)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {"version": __version__}


def test_init_sqlite_json(db: tuple[Path, str]) -> None:
    cwd, url = db
    dry = idemctl("--store", url, "init", "--dry-run", "--json", cwd=cwd)
    assert dry.returncode == 0, show(dry)
    plan = json.loads(dry.stdout)
    check_schema(plan, "init.schema.json")
    assert plan["dry_run"] is True and plan["store"] == url and plan["statements"]
    assert not (cwd / "keys.db").exists()

    first = idemctl("--store", url, "init", "--json", cwd=cwd)
    assert first.returncode == 0, show(first)
    assert json.loads(first.stdout)["changed"] is True
    second = idemctl("init", "--store", url, cwd=cwd)  # the global option after the command
    assert second.returncode == 0, show(second)
    assert "up to date; nothing changed" in second.stderr, show(second)


def test_commands_on_a_missing_sqlite_file_exit_4_and_create_nothing(tmp_path: Path) -> None:
    calls = [
        ["list"], ["stats"], ["inspect", "k"], ["unlock", "k"], ["unlock", "--stale"],
        ["forget", "k"], ["purge"],
    ]  # fmt: skip
    for result in run_all(calls, cwd=tmp_path):
        assert result.returncode == 4, show(result)
        assert "run 'idemctl init'" in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_doctor_on_a_missing_sqlite_file_exits_4_and_creates_nothing(tmp_path: Path) -> None:
    result = idemctl("--json", "doctor", cwd=tmp_path)
    assert result.returncode == 4, show(result)
    report = json.loads(result.stdout)
    check_schema(report, "doctor.schema.json")
    assert report["ok"] is False
    schema = next(f for f in report["findings"] if f["name"] == "schema")
    assert schema["ok"] is False and schema["fix"] == "run 'idemctl init'"
    assert list(tmp_path.iterdir()) == []


def test_inspect(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, completed=["pay-1"], stale=["pay-2"])
    human, as_json, missing = run_all(
        [
            ["--store", url, "inspect", "pay-1"],
            ["--store", url, "--json", "inspect", "pay-2"],
            ["--store", url, "inspect", "nope"],
        ],
        cwd=cwd,
    )
    assert human.returncode == 0, show(human)
    rows = {line.split("  ", 1)[0] for line in human.stdout.splitlines()}
    assert {
        "key", "status", "owner", "fencing token", "attempts", "lease", "age", "updated",
        "completed", "retention", "fingerprint", "error", "result",
    } <= rows, show(human)  # fmt: skip
    assert "completed" in human.stdout and '"done": "pay-1"' in human.stdout

    assert as_json.returncode == 0, show(as_json)
    with open_store(url) as store:
        record = store.get("pay-2")
    assert record is not None
    assert json.loads(as_json.stdout) == record.to_json()
    check_schema(json.loads(as_json.stdout), "record.schema.json")

    assert missing.returncode == 5, show(missing)
    assert "no record for key 'nope'" in one_error_line(missing)


def test_list(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, completed=["a-1", "a-2", "b-1"], failed=["a-3"], stale=["s-1"], live=["l-1"])
    (
        table, completed, stale, prefixed, as_json, page, everything, old, bad,
    ) = run_all(
        [
            ["--store", url, "list"],
            ["--store", url, "list", "--status", "completed"],
            ["--store", url, "list", "--stale"],
            ["--store", url, "list", "--prefix", "a-", "--json"],
            ["--store", url, "--json", "list"],
            ["--store", url, "list", "--limit", "2"],
            ["--store", url, "list", "--limit", "0"],
            ["--store", url, "list", "--older-than", "1h"],
            ["--store", url, "list", "--older-than", "soon"],
        ],
        cwd=cwd,
    )  # fmt: skip
    assert table.returncode == 0, show(table)
    assert table.stdout.split()[:6] == ["KEY", "STATUS", "TOKEN", "ATTEMPTS", "LEASE", "AGE"]
    for key in ("a-1", "a-2", "a-3", "b-1", "s-1", "l-1"):
        assert key in table.stdout, show(table)
    assert "in_progress (stale)" in next(x for x in table.stdout.splitlines() if "s-1" in x)

    assert completed.returncode == 0, show(completed)
    assert {line.split()[0] for line in completed.stdout.splitlines()[1:]} == {
        "a-1", "a-2", "b-1",
    }  # fmt: skip
    assert [line.split()[0] for line in stale.stdout.splitlines()[1:]] == ["s-1"], show(stale)
    assert sorted(listed_keys(prefixed)) == ["a-1", "a-2", "a-3"]
    records = ndjson(as_json.stdout)
    assert sorted(r["key"] for r in records) == ["a-1", "a-2", "a-3", "b-1", "l-1", "s-1"]
    for record in records:
        check_schema(record, "record.schema.json")

    assert page.returncode == 0, show(page)
    assert len(page.stdout.splitlines()) == 3, show(page)  # header + 2 rows
    more = re.search(r"showing 2; for more: idemctl list \.\.\. --cursor '([^']+)'", page.stderr)
    assert more is not None, show(page)
    rest = idemctl("--store", url, "list", "--limit", "0", "--cursor", more.group(1), cwd=cwd)
    first_two = [line.split()[0] for line in page.stdout.splitlines()[1:]]
    remaining = [line.split()[0] for line in rest.stdout.splitlines()[1:]]
    assert sorted(first_two + remaining) == ["a-1", "a-2", "a-3", "b-1", "l-1", "s-1"]
    assert len(everything.stdout.splitlines()) == 7 and "showing" not in everything.stderr

    assert old.returncode == 0 and old.stdout == "", show(old)
    assert "no records match" in old.stderr
    assert bad.returncode == 2, show(bad)
    assert "not a duration" in bad.stderr


def test_stats(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, completed=["c-1", "c-2"], failed=["f-1"], stale=["s-1"], past_retention=["p-1"])
    human, as_json = run_all(
        [["--store", url, "stats"], ["--store", url, "stats", "--json"]], cwd=cwd
    )
    assert human.returncode == 0, show(human)
    lines = {" ".join(line.split()[:2]): line for line in human.stdout.splitlines()}
    assert lines["in_progress 1"] and lines["completed 2"] and lines["failed 1"], show(human)
    assert "stale leases" in human.stdout and "idemctl list --stale" in human.stdout
    assert "past retention" in human.stdout and "idemctl purge" in human.stdout

    assert as_json.returncode == 0, show(as_json)
    counts = json.loads(as_json.stdout)
    check_schema(counts, "stats.schema.json")
    assert counts["store"] == url
    assert counts["by_status"] == {"in_progress": 1, "completed": 2, "failed": 1}
    assert counts["total"] == 4 and counts["stale"] == 1 and counts["past_retention"] == 1
    assert counts["oldest_in_progress_age_seconds"] > 0


def test_doctor_sqlite(db: tuple[Path, str]) -> None:
    cwd, url = db
    assert idemctl("--store", url, "init", cwd=cwd).returncode == 0
    human, as_json = run_all(
        [["--store", url, "doctor"], ["doctor", "--json"]],
        cwd=cwd,
        env={"IDEMCTL_STORE": url},
    )
    assert human.returncode == 0, show(human)
    assert "all checks passed" in human.stderr
    assert as_json.returncode == 0, show(as_json)
    report = json.loads(as_json.stdout)
    check_schema(report, "doctor.schema.json")
    assert report["ok"] is True and report["store"] == url
    assert report["findings"][0] == {
        "name": "store", "ok": True, "level": "ok", "detail": f"{url} (from IDEMCTL_STORE)",
        "fix": None,
    }  # fmt: skip
    assert report["store_source"] == "IDEMCTL_STORE"
    assert human.stderr.startswith(f"store: {url} (from --store)\n")  # the flag, over the env
    assert all(f["ok"] for f in report["findings"])


def test_unlock_by_key(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, stale=["s-1"], live=["l-1", "l-2"], completed=["c-1"])
    token = tokens(url, "s-1", "l-2")
    freed, live, done, missing, forced_json = run_all(
        [
            ["--store", url, "unlock", "s-1"],
            ["--store", url, "unlock", "l-1"],
            ["--store", url, "unlock", "c-1"],
            ["--store", url, "unlock", "nope"],
            ["--store", url, "unlock", "l-2", "--force", "--json"],
        ],
        cwd=cwd,
    )
    assert freed.returncode == 0, show(freed)
    assert freed.stdout.strip() == (
        f"unlocked 's-1': fencing token {token['s-1']}, the next claim gets {token['s-1'] + 1}"
    )
    assert live.returncode == 6 and "live lease" in one_error_line(live), show(live)
    assert done.returncode == 6 and "is completed" in one_error_line(done), show(done)
    assert missing.returncode == 5 and "no record for key 'nope'" in one_error_line(missing)
    assert forced_json.returncode == 0, show(forced_json)
    action = json.loads(forced_json.stdout)
    check_schema(action, "action.schema.json")
    assert action["action"] == "unlock" and action["keys"] == ["l-2"] and action["count"] == 1
    assert action["record"]["key"] == "l-2" and action["record"]["owner"] is None

    with open_store(url) as store:
        assert isinstance(store.claim("l-1", lease=1), Busy)  # the refused unlock left it held
        for key in ("s-1", "l-2"):
            again = store.claim(key, lease=1)
            assert isinstance(again, Acquired) and again.fencing_token == token[key] + 1


def test_unlock_usage_errors(tmp_path: Path) -> None:
    calls = [
        ["unlock"],
        ["unlock", "k", "--stale"],
        ["unlock", "--stale", "--force"],
        ["unlock", "k", "--yes"],
        ["unlock", "k", "--older-than", "5m"],
        ["unlock", "--stale", "--older-than", "later"],
    ]
    for result in run_all(calls, cwd=tmp_path):
        assert result.returncode == 2, show(result)
    assert list(tmp_path.iterdir()) == []


def test_unlock_stale_asks_first(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, stale=["s-1", "s-2"], live=["l-1"])
    token = tokens(url, "s-1")
    dry, no_input, none_so_old = run_all(
        [
            ["--store", url, "unlock", "--stale", "--dry-run"],
            ["--store", url, "unlock", "--stale"],
            ["--store", url, "unlock", "--stale", "--older-than", "1h"],
        ],
        cwd=cwd,
    )
    assert dry.returncode == 0, show(dry)
    assert dry.stdout.split() == ["s-1", "s-2"]
    assert f"dry run: 2 lease(s) would be freed, on {url}" in dry.stderr
    assert no_input.returncode == 6, show(no_input)
    assert f"Free 2 stale lease(s) on {url}?" in no_input.stderr
    assert "nothing changed: not confirmed" in no_input.stderr
    assert none_so_old.returncode == 0, show(none_so_old)  # none expired an hour ago: no question
    assert none_so_old.stdout.strip() == f"freed 0 lease(s) on {url}"

    said_no = idemctl("--store", url, "unlock", "--stale", cwd=cwd, input="n\n")
    assert said_no.returncode == 6, show(said_no)
    with open_store(url) as store:
        held = [(r.key, r.owner is not None) for r in store.scan(stale_only=True).records]
    assert held == [("s-1", True), ("s-2", True)]  # declined: both still held by their owner

    said_yes = idemctl("--store", url, "unlock", "--stale", "--json", cwd=cwd, input="y\n")
    assert said_yes.returncode == 0, show(said_yes)
    action = json.loads(said_yes.stdout)
    check_schema(action, "action.schema.json")
    assert action == {
        "action": "unlock", "store": url, "store_source": "--store", "dry_run": False,
        "count": 2, "keys": ["s-1", "s-2"],
        "record": None, "entity": None,
    }  # fmt: skip
    with open_store(url) as store:
        # Released, not deleted: still in progress (listed by --released, no longer by
        # --stale) until claimed again.
        assert {r.key: r.owner for r in store.scan(released_only=True).records} == {
            "s-1": None, "s-2": None,
        }  # fmt: skip
        assert store.scan(stale_only=True).records == []
        assert isinstance(store.claim("l-1", lease=1), Busy)
        again = store.claim("s-1", lease=1)
        assert isinstance(again, Acquired) and again.fencing_token == token["s-1"] + 1


def test_forget(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, completed=["c-1"], failed=["f-1"], live=["l-1", "l-2"])
    gone, failed_json, busy, forced, missing = run_all(
        [
            ["--store", url, "forget", "c-1"],
            ["--store", url, "forget", "f-1", "--json"],
            ["--store", url, "forget", "l-1"],
            ["--store", url, "forget", "l-2", "--force"],
            ["--store", url, "forget", "nope"],
        ],
        cwd=cwd,
    )
    assert gone.returncode == 0, show(gone)
    assert gone.stdout.startswith("forgot 'c-1' (it was completed): ")
    assert failed_json.returncode == 0, show(failed_json)
    action = json.loads(failed_json.stdout)
    check_schema(action, "action.schema.json")
    assert action["action"] == "forget" and action["keys"] == ["f-1"]
    assert action["record"]["status"] == "failed" and action["record"]["error"] == "card declined"
    assert busy.returncode == 6 and "in progress" in one_error_line(busy), show(busy)
    assert forced.returncode == 0 and "forgot 'l-2' (it was in_progress)" in forced.stdout
    assert missing.returncode == 5 and "no record for key 'nope'" in one_error_line(missing)
    with open_store(url) as store:
        assert [r.key for r in store.scan().records] == ["l-1"]


def test_purge(db: tuple[Path, str]) -> None:
    cwd, url = db
    seed(url, completed=["keep"], past_retention=["old-1", "old-2"])
    dry, no_input, dry_json = run_all(
        [
            ["--store", url, "purge", "--dry-run"],
            ["--store", url, "purge"],
            ["--store", url, "purge", "--dry-run", "--json"],
        ],
        cwd=cwd,
    )
    assert dry.returncode == 0, show(dry)
    assert f"dry run: 2 record(s) past retention would be purged, on {url}" in dry.stderr
    assert no_input.returncode == 6, show(no_input)
    assert f"Delete 2 record(s) past retention on {url}?" in no_input.stderr
    check_schema(json.loads(dry_json.stdout), "action.schema.json")
    assert json.loads(dry_json.stdout)["count"] == 2

    done = idemctl("--store", url, "purge", "--yes", cwd=cwd)
    assert done.returncode == 0, show(done)
    assert done.stdout.strip() == f"purged 2 record(s) past retention on {url}"
    again = idemctl("--store", url, "--json", "purge", "--yes", cwd=cwd)
    assert again.returncode == 0, show(again)
    action = json.loads(again.stdout)
    check_schema(action, "action.schema.json")
    assert action["action"] == "purge" and action["count"] == 0 and action["keys"] is None
    assert action["dry_run"] is False
    with open_store(url) as store:
        assert store.stats().total == 1


# 3. Secrets: a URL's password shows nowhere ---------------------------------------------

PG_PASSWORD = "Pg/pw@7c%3d1e"
"""Characters that are quoted in a URL: neither the quoted nor the plain form may show."""


def _secret_forms(password: str) -> list[str]:
    from urllib.parse import quote

    return sorted({password, quote(password, safe="")})


COMMANDS: list[tuple[list[str], int]] = [
    # a command, and its exit code on a working store with one completed key "seen"
    (["init"], 0),
    (["inspect", "seen"], 0),
    (["list"], 0),
    (["stats"], 0),
    (["doctor"], 0),
    (["unlock", "seen"], 6),
    (["unlock", "--stale", "--yes"], 0),
    (["forget", "nope"], 5),
    (["purge", "--yes"], 0),
]


def _secret_case(case: str, request: pytest.FixtureRequest) -> tuple[str, str, int | None]:
    """(store URL, the password in it, the exit code of every command: None on a working
    store, where each has its own)."""
    if case == "postgres":
        server = request.getfixturevalue("postgres_server")
        return server.url(password=PG_PASSWORD, schema=unique_schema()), PG_PASSWORD, None
    server = request.getfixturevalue("redis_with_password")
    url = server.url(query=f"prefix={unique_prefix()}")
    if case == "redis-wrong-password":
        wrong = "Wrong-" + REDIS_PASSWORD[::-1]
        return url.replace(REDIS_PASSWORD, wrong), wrong, 2  # refused credentials: exit 2
    if case == "redis-unreachable":
        return url.replace(f":{server.port}/", f":{free_port()}/"), REDIS_PASSWORD, 3
    return url, REDIS_PASSWORD, None


@pytest.mark.parametrize("case", ["redis", "redis-wrong-password", "redis-unreachable", "postgres"])
def test_url_password_never_printed(
    case: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, password, every_code = _secret_case(case, request)
    if every_code is None:  # a working store: provisioned, with one completed key
        assert idemctl("--store", url, "init", cwd=tmp_path).returncode == 0
        seed(url, completed=["seen"])
    variants = (["-vv"], ["-vv", "--json"])
    calls = [[*flags, *command] for command, _ in COMMANDS for flags in variants]
    codes = [code for _, code in COMMANDS for _ in variants]
    if case == "redis":  # the test server runs without appendonly: doctor finds a problem
        codes = [1 if "doctor" in call else code for call, code in zip(calls, codes, strict=True)]
    # Runs that cannot connect spend their time waiting for retries: more of them at once.
    results = run_all(
        calls, cwd=tmp_path, env={"IDEMCTL_STORE": url}, parallel=8 if every_code else PARALLEL
    )
    for code, result in zip(codes, results, strict=True):
        output = result.stdout + result.stderr
        for secret in _secret_forms(password):
            assert secret not in output, show(result)
        assert ":***@" in output, show(result)  # the URL, redacted: in the -vv log at least
        assert result.returncode == (every_code if every_code is not None else code), show(result)
        if every_code is not None and "doctor" not in result.args:
            last = result.stderr.strip().splitlines()[-1]
            assert last.startswith("error: ") and ":***@" in last, show(result)
    doctor = json.loads(results[calls.index(["-vv", "--json", "doctor"])].stdout or "null")
    if case == "redis":
        check_schema(doctor, "doctor.schema.json")
        appendonly = next(f for f in doctor["findings"] if f["name"] == "appendonly")
        assert appendonly["ok"] is False and "appendonly yes" in appendonly["fix"]
    if case == "redis-unreachable":
        check_schema(doctor, "doctor.schema.json")
        assert [f["name"] for f in doctor["findings"]] == ["store", "connection"]
        assert doctor["findings"][1]["ok"] is False
        assert ":***@" in doctor["findings"][0]["detail"]


def test_password_from_a_config_variable_never_printed(
    postgres_server: Any, tmp_path: Path
) -> None:
    """A password kept out of idemctl.yaml with ${VAR} is hidden like one in the URL."""
    _write(
        tmp_path / "idemctl.yaml",
        f"store: postgresql://test:${{IDEM_PG_PASSWORD}}@127.0.0.1:{postgres_server.port}"
        f"/postgres?schema={unique_schema()}\n",
    )
    env = {"IDEM_PG_PASSWORD": "pw-from-env-4b2d"}
    init = idemctl("-vv", "init", cwd=tmp_path, env=env)
    doctor, stats = run_all(
        [["-vv", "--json", "doctor"], ["stats", "--json"]], cwd=tmp_path, env=env
    )
    for result in (init, doctor, stats):
        assert result.returncode == 0, show(result)
        assert "pw-from-env-4b2d" not in result.stdout + result.stderr, show(result)
    detail = json.loads(doctor.stdout)["findings"][0]["detail"]
    assert detail.startswith("postgresql://test:***@127.0.0.1:")
    assert detail.endswith(f"(from {tmp_path / 'idemctl.yaml'}: store)")
    assert json.loads(stats.stdout)["store"].startswith("postgresql://test:***@127.0.0.1")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param(
            "redis://:Sekrit-9a@127.0.0.1:1/0?bogus=1", "unknown store URL option(s) bogus",
            id="unknown-option",
        ),
        pytest.param(
            "redis://:Sekrit-9a@127.0.0.1:notaport/0", "cannot parse store URL", id="bad-port"
        ),
        pytest.param("mongodb://app:Sekrit-9a@127.0.0.1/x", "unknown store scheme", id="scheme"),
        pytest.param(
            "postgresql://app@127.0.0.1:1/db?password=Sekrit-9a&bogus=1",
            "unknown store URL option(s) bogus", id="password-option",
        ),
        pytest.param(
            "app:Sekrit-9a@127.0.0.1/x", "not a store URL", id="no-scheme"
        ),
        pytest.param(
            "redis://:Sekrit-9a@[::1/0", "cannot parse store URL", id="bad-ipv6",
        ),
        pytest.param(
            "redis://:pa#Sekrit-9a@127.0.0.1:1/0", "cannot parse store URL", id="hash-in-password",
        ),
    ],
)  # fmt: skip
def test_bad_url_errors_hide_the_password(url: str, message: str, tmp_path: Path) -> None:
    results = run_all([["--store", url, "list"], ["-vv", "--json", "--store", url, "list"]],
                      cwd=tmp_path)  # fmt: skip
    for result in results:
        assert result.returncode == 2, show(result)
        assert "Sekrit-9a" not in result.stdout + result.stderr, show(result)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and message in last, show(result)
    assert results[0].stderr.count("\n") == 1  # without -v: the one error line


# 4. Ctrl-C at the confirmation prompt -----------------------------------------------------


def test_ctrl_c_at_the_prompt_exits_130_and_frees_nothing(
    db: tuple[Path, str], spawn: Callable[..., Proc]
) -> None:
    cwd, url = db
    seed(url, stale=["s-1", "s-2", "s-3"])
    with open_store(url) as store:
        before = {r.key: r for r in store.scan().records}
    asking = spawn(
        [sys.executable, "-m", "idemctl", "--store", url, "unlock", "--stale"],
        cwd=cwd, env=cli_env(),
    )  # fmt: skip
    asking.wait_stderr("[y/n]")  # waiting for an answer on a stdin that stays open
    os.kill(asking.pid, signal.SIGINT)
    assert asking.wait() == 130, asking.stderr
    assert "interrupted" in asking.stderr
    assert "freed" not in asking.stdout
    with open_store(url) as store:
        after = {r.key: r for r in store.scan().records}
    assert after == before
    assert all(r.owner is not None for r in after.values())


# 5. Config: idemctl.yaml, profiles, precedence -------------------------------------------


@pytest.fixture
def marked_stores(tmp_path: Path) -> dict[str, str]:
    """SQLite files each holding one key that names it: which file a command used shows in
    what it lists. The working directory ``tmp_path/work`` has its own ./idemctl.db."""
    urls = {}
    for name in ("flag", "env", "profile", "file", "other"):
        urls[name] = sqlite_url(tmp_path / "stores" / f"{name}.db")
    urls["default"] = sqlite_url(tmp_path / "work" / "idemctl.db")
    (tmp_path / "stores").mkdir()
    (tmp_path / "work").mkdir()
    for name, url in urls.items():
        seed(url, completed=[f"from-{name}"])
    return urls


def test_store_precedence(marked_stores: dict[str, str], tmp_path: Path) -> None:
    urls, work, bare = marked_stores, tmp_path / "work", tmp_path / "bare"
    _write(
        work / "idemctl.yaml",
        f"store: {urls['file']}\nprofiles:\n  p:\n    store: {urls['profile']}\n  empty:\n",
    )
    bare.mkdir()
    seed(sqlite_url(bare / "idemctl.db"), completed=["from-bare-default"])
    env = {"IDEMCTL_STORE": urls["env"]}
    cases: list[tuple[list[str], dict[str, str], Path, str]] = [
        (["--store", urls["flag"], "--profile", "p", "list"], env, work, "flag"),
        (["--profile", "p", "list"], env, work, "profile"),  # the flag beats IDEMCTL_STORE
        (["list", "--profile", "p"], env, work, "profile"),
        (["--profile", "empty", "list"], env, work, "file"),  # the file, as --profile empty sees it
        (["list"], env, work, "env"),
        (["list"], {**env, "IDEMCTL_PROFILE": "p"}, work, "env"),  # env profile: after env store
        (["--profile", "p", "list"], {}, work, "profile"),
        (["list"], {"IDEMCTL_PROFILE": "p"}, work, "profile"),
        (["list", "--profile", "p"], {}, work, "profile"),  # global options on the command
        (["--profile", "empty", "list"], {}, work, "file"),  # a profile without a store
        (["list"], {}, work, "file"),
        (["--store", urls["env"], "list", "--store", urls["flag"]], {}, work, "flag"),
        (["list"], {}, bare, "bare-default"),  # no idemctl.yaml: ./idemctl.db
    ]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(
            pool.map(
                lambda c: idemctl("--json", *c[0], cwd=c[2], env=c[1]),
                cases,
            )
        )
    for (args, env_used, _, want), result in zip(cases, results, strict=True):
        assert listed_keys(result) == [f"from-{want}"], (args, env_used, show(result))


def test_default_store_is_idemctl_db_in_cwd(marked_stores: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "work"
    listed, doctor = run_all([["--json", "list"], ["--json", "doctor"]], cwd=work)
    assert listed_keys(listed) == ["from-default"]
    assert json.loads(doctor.stdout)["findings"][0]["detail"] == (
        "sqlite:///./idemctl.db (from the default)"
    )


def test_config_file_by_option_and_env(marked_stores: dict[str, str], tmp_path: Path) -> None:
    urls, work = marked_stores, tmp_path / "work"
    _write(work / "idemctl.yaml", f"store: {urls['file']}\n")
    other = _write(
        tmp_path / "elsewhere" / "other.yaml",
        f"store: {urls['other']}\nprofiles:\n  p:\n    store: {urls['profile']}\n",
    )
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--config", str(other), "list"], {}, "other"),
        (["list", "--config", str(other)], {}, "other"),
        (["list"], {"IDEMCTL_CONFIG": str(other)}, "other"),
        (["list"], {"IDEMCTL_CONFIG": str(other), "IDEMCTL_PROFILE": "p"}, "profile"),
        (["--config", str(other), "--profile", "p", "list"], {}, "profile"),
    ]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda c: idemctl("--json", *c[0], cwd=work, env=c[1]), cases))
    for (args, env, want), result in zip(cases, results, strict=True):
        assert listed_keys(result) == [f"from-{want}"], (args, env, show(result))

    doctor = idemctl("--json", "--config", str(other), "--profile", "p", "doctor", cwd=work)
    detail = json.loads(doctor.stdout)["findings"][0]["detail"]
    assert detail == f"{urls['profile']} (from --profile p in {other})"


def test_config_variables(marked_stores: dict[str, str], tmp_path: Path) -> None:
    work, stores = tmp_path / "work", tmp_path / "stores"
    _write(
        work / "idemctl.yaml",
        "store: sqlite:///${IDEM_DIR}/file.db\n"
        "profiles:\n  p:\n    store: sqlite:///${IDEM_DIR}/${IDEM_NAME}.db\n",
    )
    expanded, profile, unset, unset_but_overridden = (
        idemctl("--json", *args, cwd=work, env=env)
        for args, env in [
            (["list"], {"IDEM_DIR": str(stores)}),
            (["--profile", "p", "list"], {"IDEM_DIR": str(stores), "IDEM_NAME": "other"}),
            (["--profile", "p", "list"], {"IDEM_DIR": str(stores)}),
            (["--store", marked_stores["flag"], "list"], {}),
        ]
    )
    assert listed_keys(expanded) == ["from-file"]
    assert listed_keys(profile) == ["from-other"]
    assert unset.returncode == 2, show(unset)
    line = one_error_line(unset)
    assert "${IDEM_NAME}" in line and "not set" in line and "profiles.p.store" in line
    assert listed_keys(unset_but_overridden) == ["from-flag"]  # the file's URL is not used


VALID_CONFIGS = {
    "store only": "store: sqlite:///./idemctl.db\n",
    "profiles": (
        "store: sqlite:///./idemctl.db\nprofiles:\n  p:\n    store: redis://127.0.0.1:6379/0\n"
        "  empty:\n  q: {}\n"
    ),
    "variable": "store: postgresql://app:${PGPASSWORD}@db.internal/payments\n",
    "profiles only": "profiles:\n  prod:\n    store: dynamodb://keys?region=eu-west-1\n",
    "empty": "",
}

INVALID_CONFIGS: dict[str, tuple[str, str]] = {
    # name: (idemctl.yaml, what the error line says)
    "unknown key": ("stroe: sqlite:///x.db\n", "unknown setting 'stroe'; did you mean 'store'?"),
    "unknown profile key": (
        "profiles:\n  p:\n    stor: sqlite:///x.db\n",
        "profiles.p: unknown setting 'stor'; did you mean 'store'?",
    ),
    "store not a URL": ("store: ./idemctl.db\n", "'store' must be a store URL"),
    "store a number": ("store: 6379\n", "'store' must be a store URL"),
    "profiles a list": ("profiles:\n  - sqlite:///x.db\n", "'profiles' must map"),
    "profile not a mapping": ("profiles:\n  p: sqlite:///x.db\n", "expected a mapping"),
    "not a mapping": ("- store\n", "expected a mapping"),
}


@pytest.mark.parametrize("name", sorted(INVALID_CONFIGS))
def test_invalid_config_shape_exit_2_and_rejected_by_the_schema(name: str, tmp_path: Path) -> None:
    text, message = INVALID_CONFIGS[name]
    path = _write(tmp_path / "idemctl.yaml", text)
    result = idemctl("list", cwd=tmp_path)
    assert result.returncode == 2, show(result)
    line = one_error_line(result)
    assert message in line and "idemctl.yaml" in line, line
    with pytest.raises(ConfigError):
        load_config(path)
    assert list(validator("config.schema.json").iter_errors(yaml.safe_load(text))) != []


def test_broken_config_files(tmp_path: Path) -> None:
    _write(
        tmp_path / "syntax" / "idemctl.yaml",
        "store: sqlite:///x.db\nprofiles:\n  p:\n    store: sqlite:///p.db\n   bad: x\n",
    )
    _write(tmp_path / "ok" / "idemctl.yaml", "profiles:\n  p:\n    store: sqlite:///p.db\n")
    _write(tmp_path / "scheme" / "idemctl.yaml", "store: mongodb://db/x\n")
    _write(tmp_path / "option" / "idemctl.yaml", "store: sqlite:///x.db?bogus=1\n")
    missing = str(tmp_path / "nowhere.yaml")
    cases = [
        (["list"], {}, "syntax", "idemctl.yaml line 5: "),
        (["--config", missing, "list"], {}, "ok", "not found"),
        (["list"], {"IDEMCTL_CONFIG": missing}, "ok", "not found"),
        (["--profile", "nope", "list"], {}, "ok", "no profile 'nope'"),
        (["list"], {"IDEMCTL_PROFILE": "nope"}, "ok", "profiles: p"),
        (["list"], {}, "scheme", "unknown store scheme 'mongodb'"),
        (["list"], {}, "option", "unknown store URL option(s) bogus"),
    ]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda c: idemctl(*c[0], cwd=tmp_path / c[2], env=c[1]), cases))
    for (args, env, _, message), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, env, show(result))
        assert message in one_error_line(result), (args, env, show(result))
    assert "fix the YAML syntax" in results[0].stderr
    assert not any(p.name.endswith(".db") for p in tmp_path.rglob("*"))


def test_example_config_loads_and_matches_the_schema(tmp_path: Path) -> None:
    example = ROOT / "examples" / "idemctl.yaml"
    result = idemctl("--config", str(example), "--json", "doctor", cwd=tmp_path)
    assert result.returncode == 4, show(result)  # the default-like ./idemctl.db is missing
    detail = json.loads(result.stdout)["findings"][0]["detail"]
    assert detail == f"sqlite:///./idemctl.db (from {example}: store)"
    data = yaml.safe_load(example.read_text(encoding="utf-8"))
    assert list(validator("config.schema.json").iter_errors(data)) == []
    assert set(load_config(example).profiles) == {"staging", "prod", "lambda"}


def test_valid_configs_match_the_schema(tmp_path: Path) -> None:
    check = validator("config.schema.json")
    for name, text in VALID_CONFIGS.items():
        path = _write(tmp_path / f"{name.replace(' ', '-')}.yaml", text)
        load_config(path)  # the loader takes it ...
        data = yaml.safe_load(text)
        if data is not None:  # ... and so does the schema (an empty file is no document)
            assert list(check.iter_errors(data)) == [], name


# 6. Completions ---------------------------------------------------------------------------


def _completion_scripts() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location(
        "idemctl_completions_script", ROOT / "scripts" / "completions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scripts: dict[str, str] = module.scripts()
    return scripts


def test_completion_files_are_the_generated_ones() -> None:
    scripts = _completion_scripts()
    assert set(scripts) == {"idemctl.bash", "_idemctl", "idemctl.fish"}
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "completions").iterdir()}
    assert on_disk == scripts


BASH_COMPLETE = r"""
source "$1"
complete_words() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
    COMPREPLY=()
    _idemctl_completion idemctl
    printf '%s\n' "${COMPREPLY[@]}"
    echo ---
}
complete_words idemctl li
complete_words idemctl list --sta
complete_words idemctl unlock --st
"""


def test_bash_completion_asks_idemctl(tmp_path: Path) -> None:
    env = cli_env({"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", BASH_COMPLETE, "bash",
         str(ROOT / "completions" / "idemctl.bash")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    commands, list_options, unlock_options, _ = done.stdout.split("---\n")
    assert "list" in commands.split(), done.stdout
    assert {"--status", "--stale"} <= set(list_options.split()), done.stdout
    assert "--stale" in unlock_options.split(), done.stdout
    assert list(tmp_path.iterdir()) == []


def test_install_completion_bash(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [str(VENV_BIN / "idemctl"), "--install-completion", "bash"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env=cli_env({"HOME": str(home), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    script = home / ".bash_completions" / "idemctl.sh"
    assert script.read_text(encoding="utf-8").strip() == (
        (ROOT / "completions" / "idemctl.bash").read_text(encoding="utf-8").strip()
    )
    assert f"source '{script}'" in (home / ".bashrc").read_text(encoding="utf-8")


def test_install_completion_through_python_m(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = idemctl(
        "--install-completion", "bash", cwd=tmp_path,
        env={"HOME": str(home), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
    )  # fmt: skip
    assert done.returncode == 0, show(done)
    assert [p.name for p in (home / ".bash_completions").iterdir()] == ["idemctl.sh"]
    assert "_IDEMCTL_COMPLETE=complete_bash" in (
        home / ".bash_completions" / "idemctl.sh"
    ).read_text(encoding="utf-8")
