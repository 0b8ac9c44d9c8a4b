"""Issue 59's security findings, each against a real ``idemctl console`` process over HTTP:
a peer that claims to be the proxy (``X-Forwarded-For``), a foreign ``Host`` (DNS
rebinding), a POST from another origin, a reveal by GET or HEAD, an audit without brokers
or with brokers that never answer, guessed passwords and the time a guess takes, sessions
a login leaves behind, an operator log that cannot be written, a users file that changes,
and the lower ones: a login token the attacker chose, the store's address on the login
page, repairs over plain HTTP off loopback, ``--hash-password >> users.txt``.

The ones that need a browser (a rebinding page in chromium) are in
``test_browser_security.py``; the operator log's own (typed targets, its schema, the
default place) in ``test_security_log.py``."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest

from idemctl import open_store
from idemctl.console.auth import hash_password
from idemctl.model import ClaimRequest
from tests.backends import expire_lease
from tests.console.conftest import PASSWORDS, REPO, ConsoleProcess
from tests.polling import wait_until, wait_until_async
from tests.servers import HOST, free_port

SECRET = {"charge": "ch_secret_42"}


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A stale key, a completed one holding ``SECRET``, a live one."""
    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest("pay-stuck-1"), ClaimRequest("pay-live-2")], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=600)
        done = store.claim("pay-done-3", lease=3600)
        store.complete("pay-done-3", done.owner, done.fencing_token, SECRET)
    return url


@pytest.fixture
def console(store_url: str, tmp_path: Path) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(store_url, tmp_path, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def open_console(store_url: str, tmp_path: Path) -> Iterator[ConsoleProcess]:
    """``--no-auth --allow-repair`` on loopback: whoever reaches it is the operator."""
    process = ConsoleProcess(store_url, tmp_path, "--no-auth", "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found is not None, html
    return found.group(1)


def log_in(base: str, name: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
    answer = login(client, name, password)
    assert answer.status_code == 303, answer.text
    return client


def login(client: httpx.Client, name: str, password: str) -> httpx.Response:
    """One try at the login form, with the token its page gave."""
    token = csrf_of(client.get("/login").text)
    return client.post("/login", data={"csrf": token, "name": name, "password": password})


def logged(process: ConsoleProcess) -> list[dict[str, Any]]:
    """The operator log's lines."""
    if not process.log.is_file():
        return []
    return [json.loads(line) for line in process.log.read_text().splitlines() if line.strip()]


def held(url: str, key: str) -> bool:
    with open_store(url) as store:
        record = store.get(key)
        return record is not None and record.owner is not None


def unlock_form(client: httpx.Client, key: str, **extra: str) -> dict[str, str]:
    """What a confirmed unlock of ``key`` posts: what its dry run asks to send back."""
    preview = client.get("/api/actions/unlock", params={"key": key}).json()
    sent = {"key": key, "confirm": preview["confirm"], **extra}
    if "preview" in preview:
        sent["preview"] = preview["preview"]
    return sent


# 1. The proxy is the console's to decide ---------------------------------------------------


def test_a_peer_claiming_to_be_the_trusted_proxy_gets_no_user(
    store_url: str, tmp_path: Path
) -> None:
    """uvicorn's proxy headers would make 127.0.0.1 "be" 10.9.9.9 on its say-so."""
    process = ConsoleProcess(store_url, tmp_path, "--trust-proxy", "10.9.9.9")
    try:
        for claim in (
            {"X-Forwarded-For": "10.9.9.9"},
            {"X-Forwarded-For": "10.9.9.9", "X-Forwarded-Proto": "https"},
            {"Forwarded": "for=10.9.9.9"},
            {"X-Real-IP": "10.9.9.9"},
        ):
            headers = {**claim, "X-Forwarded-User": "ana"}
            api = httpx.get(f"{process.base}/api/", headers=headers)
            assert api.status_code == 401, (claim, api.text)
            shown = httpx.get(f"{process.base}/api/keys/pay-done-3?reveal=1", headers=headers)
            assert shown.status_code == 401 and SECRET["charge"] not in shown.text
            page = httpx.get(f"{process.base}/", headers=headers)
            assert page.status_code == 303 and page.headers["location"].startswith("/login")
    finally:
        process.stop()


# 2. Host allowlist, Origin, no reveal by GET -----------------------------------------------


def test_a_foreign_host_gets_421_logged_once_and_the_loopback_names_are_served(
    open_console: ConsoleProcess,
) -> None:
    base, port = open_console.base, open_console.port
    foreign = {"Host": f"attacker.example:{port}"}
    assert httpx.get(f"{base}/", headers=foreign).status_code == 421
    assert httpx.get(f"{base}/api/keys/pay-done-3", headers=foreign).status_code == 421
    acted = httpx.post(
        f"{base}/api/actions/unlock",
        data={"key": "pay-stuck-1", "confirm": "pay-stuck-1"},
        headers=foreign,
    )
    assert acted.status_code == 421 and held(open_console.url, "pay-stuck-1")
    for header in ("x-frame-options", "content-security-policy"):
        assert header in acted.headers
    refused = [e for e in logged(open_console) if e.get("target_kind") == "host"]
    assert len(refused) == 1, refused  # three requests, one line
    assert refused[0]["target"] == f"attacker.example:{port}"
    assert refused[0]["action"] == "refused" and refused[0]["result"].startswith("421")
    assert httpx.get(f"{base}/", headers={"Host": "other.example"}).status_code == 421
    assert len([e for e in logged(open_console) if e.get("target_kind") == "host"]) == 2
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(f"{base}/", headers={"Host": name}).status_code == 200, name


def test_allowed_host_names_a_proxy_s_public_name(store_url: str, tmp_path: Path) -> None:
    process = ConsoleProcess(store_url, tmp_path, "--allowed-host", "console.example.com")
    try:
        for name in ("console.example.com", f"console.example.com:{process.port}", "localhost"):
            answer = httpx.get(f"{process.base}/login", headers={"Host": name})
            assert answer.status_code == 200, name
        assert (
            httpx.get(f"{process.base}/login", headers={"Host": "evil.example.com"}).status_code
            == 421
        )
    finally:
        process.stop()


def test_a_post_from_another_origin_is_refused_even_without_a_session(
    open_console: ConsoleProcess,
) -> None:
    """``--no-auth`` has no session, hence no CSRF token: the Origin is what stops a page
    elsewhere (another port of this host is another origin too)."""
    client = httpx.Client(base_url=open_console.base, timeout=60)
    form = unlock_form(client, "pay-stuck-1")
    for origin in (
        "http://attacker.example",
        "null",
        f"http://127.0.0.1:{free_port()}",
        f"http://attacker.example:{open_console.port}",
    ):
        answer = client.post("/api/actions/unlock", data=form, headers={"Origin": origin})
        assert answer.status_code == 403, (origin, answer.text)
    cross = client.post("/api/actions/unlock", data=form, headers={"Sec-Fetch-Site": "same-site"})
    assert cross.status_code == 403
    assert held(open_console.url, "pay-stuck-1")
    refusals = [e for e in logged(open_console) if e["action"] == "refused"]
    assert len(refusals) >= 5 and all(e["user"] == "local" for e in refusals)
    own = client.post("/api/actions/unlock", data=form, headers={"Origin": open_console.base})
    assert own.status_code == 200, own.text
    assert not held(open_console.url, "pay-stuck-1")


def test_a_session_s_post_from_another_origin_is_refused_despite_its_token(
    console: ConsoleProcess,
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    token = csrf_of(ana.get("/").text)
    form = unlock_form(ana, "pay-stuck-1", csrf=token)
    for headers in ({"Origin": "http://attacker.example"}, {"Sec-Fetch-Site": "cross-site"}):
        answer = ana.post("/api/actions/unlock", data=form, headers=headers)
        assert answer.status_code == 403, (headers, answer.text)
    assert held(console.url, "pay-stuck-1")
    done = ana.post("/api/actions/unlock", data=form, headers={"Origin": console.base})
    assert done.status_code == 200, done.text


def test_a_proxy_s_user_is_origin_checked_too(store_url: str, tmp_path: Path) -> None:
    """A proxy's users have no session and no CSRF token: ``Sec-Fetch-Site`` alone let a
    browser without it (or a page that strips it) through."""
    process = ConsoleProcess(store_url, tmp_path, "--trust-proxy", "127.0.0.1", "--allow-repair")
    try:
        client = httpx.Client(base_url=process.base, timeout=60,
                              headers={"X-Forwarded-User": "ana"})  # fmt: skip
        form = unlock_form(client, "pay-stuck-1")
        for origin in ("http://attacker.example", "null"):
            answer = client.post("/api/actions/unlock", data=form, headers={"Origin": origin})
            assert answer.status_code == 403, (origin, answer.text)
        assert held(store_url, "pay-stuck-1")
        own = client.post("/api/actions/unlock", data=form, headers={"Origin": process.base})
        assert own.status_code == 200, own.text
    finally:
        process.stop()


def test_get_and_head_never_reveal_nor_log_a_reveal_a_post_with_the_token_does(
    console: ConsoleProcess,
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    for method in ("GET", "HEAD"):
        for path in ("/api/keys/pay-done-3?reveal=1", "/keys/pay-done-3?reveal=1"):
            answer = ana.request(method, path)
            assert SECRET["charge"] not in answer.text, (method, path)
    assert [e for e in logged(console) if e["action"] == "reveal"] == []
    # A POST without the session's token (a cross-site form, an <img>'s GET made POST) is
    # refused and reveals nothing.
    forged = ana.post("/api/keys/pay-done-3", data={"csrf": "guessed"})
    assert forged.status_code == 403 and SECRET["charge"] not in forged.text
    token = csrf_of(ana.get("/").text)
    shown = ana.post("/api/keys/pay-done-3", data={"csrf": token})
    assert shown.status_code == 200 and shown.json()["result"] == SECRET
    page = ana.post("/keys/pay-done-3", data={"csrf": token})
    assert page.status_code == 200 and SECRET["charge"] in page.text
    reveals = [e for e in logged(console) if e["action"] == "reveal"]
    assert [(e["user"], e["target"], e["target_kind"]) for e in reveals] == [
        ("ana", "pay-done-3", "key"), ("ana", "pay-done-3", "key"),
    ]  # fmt: skip
    bo = log_in(console.base, "bo", PASSWORDS["bo"])
    viewer = bo.post("/api/keys/pay-done-3", data={"csrf": csrf_of(bo.get("/").text)})
    assert viewer.status_code == 403 and SECRET["charge"] not in viewer.text


# 4. Bounded cost per caller -----------------------------------------------------------------


def test_an_audit_without_brokers_is_refused_at_once(console: ConsoleProcess) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    answer = ana.get("/api/audit", params={"group": "g", "topic": "t"})
    assert answer.status_code == 409, answer.text
    assert "--brokers" in answer.json()["error"]
    assert ana.get("/audit", params={"group": "g", "topic": "t"}).status_code == 409


@pytest.fixture
def silent_broker() -> Iterator[int]:
    """A port that takes connections and never answers (a broker behind a dead link)."""
    with socket.socket() as listener:
        listener.bind((HOST, free_port()))
        listener.listen(64)
        yield listener.getsockname()[1]


def test_audits_are_bounded_in_time_and_in_number(
    store_url: str, tmp_path: Path, silent_broker: int
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "try:\n    import idemctl.console.security as s\n    s.AUDIT_SECONDS = 1.0\n"
        "except ImportError:\n    pass\n"
    )
    process = ConsoleProcess(store_url, tmp_path, "--brokers", f"{HOST}:{silent_broker}", path=site)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        answers: list[httpx.Response] = []
        while not answers or answers[-1].status_code != 429:
            answers.append(ana.get("/api/audit", params={"group": "g", "topic": "t"}))
            assert len(answers) <= 10, [a.status_code for a in answers]
        *timed_out, busy = answers
        assert timed_out and all(a.status_code == 504 for a in timed_out), answers
        assert "within 1 s" in timed_out[0].json()["error"]
        assert int(busy.headers["retry-after"]) >= 1
        assert ana.get("/api/").status_code == 200  # the other pages go on
    finally:
        process.stop()


def test_logins_are_throttled_per_name_and_per_address(console: ConsoleProcess) -> None:
    client = httpx.Client(base_url=console.base, timeout=60)
    for _ in range(5):
        assert login(client, "bo", "wrong").status_code == 401
    throttled = login(client, "bo", "wrong")
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert login(client, "bo", PASSWORDS["bo"]).status_code == 429  # even the right one
    for n in range(15):  # other names, the same address: 20 failures in all
        assert login(client, f"guess-{n}", "wrong").status_code == 401, n
    answer = login(client, "ana", PASSWORDS["ana"])
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    assert "idemctl_session" not in answer.cookies


RECORDER = """
import idemctl.console.auth as auth
_verify = auth.verify
def verify(hashed, password):
    parts = hashed.split("$")
    kind = "$".join(parts[:4] if hashed.startswith("$argon2") else parts[:3])
    with open({out!r}, "a") as out:
        out.write(kind + "\\n")
    return _verify(hashed, password)
auth.verify = verify
"""


def test_an_unknown_name_costs_what_a_user_of_each_hash_kind_costs(
    store_url: str, tmp_path: Path
) -> None:
    """The hash an unknown name is checked against has the parameters of the users'
    hashes: a bcrypt cost-5 user (``htpasswd -B``'s default) answers a wrong password in
    milliseconds, so an argon2 decoy alone would tell names apart."""
    from argon2 import PasswordHasher

    argon = PasswordHasher(time_cost=2, memory_cost=8192, parallelism=1).hash("right horse")
    crypt = bcrypt.hashpw(b"battery staple", bcrypt.gensalt(rounds=5)).decode()
    users = tmp_path / "mixed-users.txt"
    users.write_text(f"ana operator {argon}\nbo viewer {crypt}\n")
    site, seen = tmp_path / "site", tmp_path / "verified.txt"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER.format(out=str(seen)))
    process = ConsoleProcess(store_url, tmp_path, "--users", str(users), path=site)
    try:
        client = httpx.Client(base_url=process.base, timeout=60)
        kinds = {"$argon2id$v=19$m=8192,t=2,p=1", "$2b$05"}
        for name in ("ana", "bo"):
            assert login(client, name, "wrong").status_code == 401
        known = seen.read_text().split()
        assert set(known) == kinds
        by_name: dict[str, str] = {}
        for n in range(12):
            name = f"nobody-{n}"
            before = len(seen.read_text().split())
            assert login(client, name, "wrong").status_code == 401
            after = seen.read_text().split()
            assert len(after) == before + 1, name  # one hash, as for a user
            by_name[name] = after[-1]
        assert set(by_name.values()) == kinds, by_name  # both kinds among 12 names
        again = seen.read_text().split()
        assert login(client, "nobody-0", "other").status_code == 401
        assert seen.read_text().split()[len(again)] == by_name["nobody-0"]  # the same each time
    finally:
        process.stop()


def test_hashing_runs_a_few_at_a_time_and_turns_away_the_rest() -> None:
    import asyncio

    from idemctl.console.throttle import Gate, Throttled

    async def scenario() -> list[str]:
        gate, release, said = Gate(at_once=2, waiting=2), asyncio.Event(), []

        async def one(n: int) -> None:
            try:
                async with gate:
                    said.append(f"in {n}")
                    await release.wait()
            except Throttled as exc:
                said.append(f"busy {n} {exc.retry_after}")

        tasks = [asyncio.create_task(one(n)) for n in range(5)]
        # Two in, two waiting their turn (they say nothing yet), one turned away.
        await wait_until_async(lambda: len(said) >= 3, "the five tasks at the gate")
        entered = list(said)
        release.set()
        await asyncio.gather(*tasks)
        return [*entered, "--", *said]

    said = asyncio.run(scenario())
    entered = said[: said.index("--")]
    assert sorted(entered) == ["busy 4 1", "in 0", "in 1"], said
    assert sorted(s for s in said[said.index("--") + 1 :] if s.startswith("in")) == [
        f"in {n}" for n in range(4)
    ]


def test_a_second_login_by_the_same_browser_ends_its_first_session(
    console: ConsoleProcess,
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    first = ana.cookies["idemctl_session"]
    assert login(ana, "ana", PASSWORDS["ana"]).status_code == 303
    second = ana.cookies["idemctl_session"]
    assert second != first
    assert httpx.get(f"{console.base}/api/", cookies={"idemctl_session": first}).status_code == 401
    assert ana.get("/api/").status_code == 200


def test_sessions_are_capped_per_user(console: ConsoleProcess) -> None:
    clients = [log_in(console.base, "ana", PASSWORDS["ana"]) for _ in range(11)]
    assert clients[0].get("/api/").status_code == 401  # the oldest made room
    assert all(c.get("/api/").status_code == 200 for c in clients[1:])


def test_expired_sessions_are_swept() -> None:
    from idemctl.console.auth import Sessions, User

    now = [0.0]
    sessions = Sessions(idle=60, lifetime=3600, clock=lambda: now[0])
    for n in range(10_001):
        sessions.start(User(f"user-{n}", "viewer"))
    assert len(sessions) == 10_001
    now[0] += 61
    sessions.start(User("ana", "operator"))
    assert len(sessions) == 1


# 5. No log line, no action -------------------------------------------------------------------


def test_an_operator_log_that_cannot_be_written_stops_the_console_at_start(
    store_url: str, tmp_path: Path
) -> None:
    users = tmp_path / "users.txt"
    users.write_text(f"ana operator {hash_password(PASSWORDS['ana'])}\n")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    for path in (tmp_path / "a-file" / "operator.log", tmp_path / "a-folder"):
        command = [
            sys.executable, "-m", "idemctl", "--store", store_url, "console",
            "--bind", f"{HOST}:{free_port()}", "--users", str(users), "--operator-log", str(path),
        ]  # fmt: skip
        done = subprocess.Popen(
            command, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            _, err = done.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            done.kill()
            done.communicate()
            raise AssertionError(f"served with an unwritable operator log {path}") from None
        assert done.returncode == 2, err
        assert str(path) in err


def test_an_action_whose_line_cannot_be_written_is_not_performed(
    console: ConsoleProcess,
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    token = csrf_of(ana.get("/").text)
    form = unlock_form(ana, "pay-stuck-1", csrf=token)
    console.log.unlink(missing_ok=True)
    console.log.mkdir()  # as root, a folder is what no one can append to
    answer = ana.post("/api/actions/unlock", data=form)
    assert answer.status_code == 503, answer.text
    assert "operator log" in answer.json()["error"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" in answer.headers
    assert held(console.url, "pay-stuck-1")
    page = ana.post("/actions/unlock", data=form)
    assert page.status_code == 503 and held(console.url, "pay-stuck-1")
    shown = ana.post("/api/keys/pay-done-3", data={"csrf": token})
    assert shown.status_code == 503 and SECRET["charge"] not in shown.text


# 6. The users file is watched ----------------------------------------------------------------


def test_a_users_file_change_takes_effect_and_a_broken_one_keeps_the_last_good(
    console: ConsoleProcess, tmp_path: Path
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    bo = log_in(console.base, "bo", PASSWORDS["bo"])
    users = tmp_path / "users.txt"
    users.write_text(
        f"# bo left; ana's password changed\nana operator {hash_password('new horse')}\n"
    )
    wait_until(lambda: bo.get("/api/").status_code == 401, "a removed user's session ends")
    assert ana.get("/api/").status_code == 401  # a changed password's session ends too
    client = httpx.Client(base_url=console.base, timeout=60)
    assert login(client, "ana", PASSWORDS["ana"]).status_code == 401
    assert login(client, "bo", PASSWORDS["bo"]).status_code == 401
    assert login(client, "ana", "new horse").status_code == 303
    users.write_text("ana operator not-a-hash\n")

    def warned() -> bool:
        """The file is looked at when a request comes (at most once a second)."""
        return client.get("/healthz").is_success and "users file" in console.stderr.read_text()

    wait_until(warned, "a warning on stderr")
    assert "not-a-hash" not in console.stderr.read_text()
    again = httpx.Client(base_url=console.base, timeout=60)
    assert login(again, "ana", "new horse").status_code == 303  # the last good users
    assert client.get("/api/").status_code == 200


def test_hash_password_writes_only_the_hash_to_stdout() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "idemctl", "console", "--hash-password"],
        input="right horse\nright horse\n", capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, start_new_session=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("$argon2id$"), done.stdout
    from idemctl.console.auth import verify

    assert verify(line, "right horse")
    assert "password" in done.stderr.lower()


# 8. The lower ones ------------------------------------------------------------------------


def test_the_login_form_takes_only_a_token_the_console_issued(console: ConsoleProcess) -> None:
    chosen = "attacker-chosen-token"
    client = httpx.Client(base_url=console.base, cookies={"idemctl_login": chosen})
    answer = client.post(
        "/login", data={"csrf": chosen, "name": "ana", "password": PASSWORDS["ana"]}
    )
    assert answer.status_code == 403 and "idemctl_session" not in answer.cookies


def test_the_login_page_shows_nothing_of_the_store(console: ConsoleProcess) -> None:
    page = httpx.get(f"{console.base}/login").text
    assert "keys.db" not in page and "sqlite" not in page
    assert "keys.db" not in httpx.get(f"{console.base}/api/").text


def test_repairs_over_plain_http_off_loopback_warn(store_url: str, tmp_path: Path) -> None:
    process = ConsoleProcess(store_url, tmp_path, "--allow-repair", bind="0.0.0.0")
    try:
        err = process.stderr.read_text()
        assert "warning" in err.lower() and "--behind-tls" in err, err
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        assert 'id="insecure"' in ana.get("/").text  # and every page says so
    finally:
        process.stop()
