"""The console's users, sessions, CSRF tokens and proxy trust (``idemctl.console.auth``)."""

from __future__ import annotations

import bcrypt
import pytest

from idemctl.console.auth import Proxy, Sessions, User, Users, hash_password, verify
from idemctl.errors import ConfigError


def users() -> Users:
    argon = hash_password("right horse")
    crypt = bcrypt.hashpw(b"battery staple", bcrypt.gensalt(rounds=4)).decode()
    return Users.parse(f"# the on-call\nana operator {argon}\nbo viewer {crypt}\n", "users.txt")


def test_a_password_is_checked_against_its_argon2_or_bcrypt_hash() -> None:
    people = users()
    assert people.check("ana", "right horse") == User("ana", "operator")
    assert people.check("bo", "battery staple") == User("bo", "viewer")
    assert people.check("ana", "wrong horse") is None
    assert people.check("bo", "right horse") is None
    assert people.check("nobody", "right horse") is None  # checked against a decoy hash
    assert not verify("plain-text", "plain-text")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("ana operator", "write NAME ROLE HASH"),
        ("ana admin $argon2id$x", "role 'admin': use viewer or operator"),
        ("ana viewer secret", "the hash must be argon2"),
    ],
)
def test_a_bad_users_line_is_refused_naming_its_place(line: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"users.txt, line 1: {says}"):
        Users.parse(line, "users.txt")


def test_a_login_always_starts_a_new_session_and_an_idle_one_ends() -> None:
    now = [1000.0]
    sessions = Sessions(idle=60, lifetime=3600, clock=lambda: now[0])
    ana = User("ana", "operator")
    first = sessions.start(ana)
    second = sessions.start(ana)
    assert first.id != second.id and first.csrf != second.csrf
    assert sessions.get("planted-by-someone-else") is None
    now[0] += 59
    assert sessions.get(first.id) is first  # used: its idle time starts again
    now[0] += 61
    assert sessions.get(first.id) is None
    sessions.end(second.id)
    assert sessions.get(second.id) is None


def test_a_session_ends_after_its_lifetime_however_busy() -> None:
    now = [0.0]
    sessions = Sessions(idle=60, lifetime=100, clock=lambda: now[0])
    session = sessions.start(User("ana", "viewer"))
    for _ in range(3):
        now[0] += 40
        seen = sessions.get(session.id)
    assert seen is None  # 120 s in all


def test_a_form_s_csrf_token_must_be_its_session_s() -> None:
    sessions = Sessions()
    one, other = sessions.start(User("a", "viewer")), sessions.start(User("b", "viewer"))
    assert one.csrf_valid(one.csrf)
    assert not one.csrf_valid(other.csrf) and not one.csrf_valid(None) and not one.csrf_valid("")


def test_a_proxy_s_user_header_is_believed_only_from_its_addresses() -> None:
    proxy = Proxy(["127.0.0.2", "10.0.0.0/8"])
    header = {"x-forwarded-user": "ana"}
    people = users()
    assert proxy.user("127.0.0.2", header, people) == User("ana", "operator")
    assert proxy.user("10.1.2.3", {"x-forwarded-user": "carl"}, people) == User("carl", "viewer")
    assert proxy.user("127.0.0.1", header, people) is None  # not the proxy: ignored
    assert proxy.user("127.0.0.2", {}, people) is None
    assert proxy.user(None, header, people) is None
    with pytest.raises(ConfigError, match="--trust-proxy"):
        Proxy(["not-an-address"])
