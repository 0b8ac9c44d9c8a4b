"""``Idempotency-Key`` values as clients make them, property-based (hypothesis) over
``policy.key_of(Options(), raw)``: any 1-255 printable ASCII characters (0x21-0x7E, spaces
inside) bare, or as a Structured Field string (RFC 8941 3.3.3, ``\\"`` and ``\\\\``
escaped) whose parameters are ignored; UUIDs of every version, base64 (standard and
URL-safe), ULIDs and stripe-python's own generator. Refused with the 400 problem
``invalid-key``: empty, over 255 characters, control or non-ASCII characters.

Then a handful of such keys through the example apps under uvicorn and gunicorn: each
charges once and is replayed.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from idemctl.http.policy import Options, Problem, key_of
from tests.http.conftest import SERVERS, problem, serve, store_url, unique

OPTIONS = Options()
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    database=None,  # no .hypothesis/ in the work tree
    suppress_health_check=[HealthCheck.too_slow],
)

PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))
"""0x21-0x7E: what a key may hold, with spaces inside."""
CONTROL = [chr(c) for c in range(0x20) if c not in (0x09, 0x20)] + ["\x7f"]
"""Control characters (tab too, inside a key: see ``with_control``)."""


def is_key(raw: str, expected: str) -> None:
    got = key_of(OPTIONS, raw)
    assert got == expected, f"{raw!r}: {got!r}"


def is_refused(raw: str) -> Problem:
    got = key_of(OPTIONS, raw)
    assert isinstance(got, Problem), f"{raw!r} accepted as {got!r}"
    assert got.status == 400 and got.name == "invalid-key", got
    return got


def sf_string(key: str) -> str:
    """``key`` as a Structured Field string."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def printable_keys(min_size: int = 1, max_size: int = 255) -> st.SearchStrategy[str]:
    """Printable ASCII, spaces only inside (a header's own surrounding space is not the
    key's)."""
    ends = st.sampled_from(PRINTABLE)
    inner = st.text(alphabet=PRINTABLE + " ", min_size=max(0, min_size - 2), max_size=max_size - 2)
    many = st.tuples(ends, inner, ends).map("".join)
    return st.one_of(ends, many) if min_size <= 1 else many


# Accepted ------------------------------------------------------------------------------------


@PROPERTY
@given(printable_keys().filter(lambda k: not k.startswith('"')))
@example("8e03978e-40d5-43e8-bc93-6894a57f9324")
@example("q83vEjRWeJA=")
@example("0")
@example("a b")
@example("k" * 255)
@example("x,y")
@example("abc;v=1")
def test_printable_ascii_is_a_key_bare(key: str) -> None:
    """A bare key is the header's value (one starting with ``"`` is read as an sf-string:
    ``test_printable_ascii_is_a_key_as_an_sf_string``)."""
    is_key(key, key)
    is_key(f" {key}\t", key)  # the field's surrounding whitespace is not the key's


@PROPERTY
@given(printable_keys())
@example('"')
@example("\\")
@example('say "hi" \\o/')
@example("k" * 255)
def test_printable_ascii_is_a_key_as_an_sf_string(key: str) -> None:
    is_key(sf_string(key), key)


_PARAM_KEY = st.tuples(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz*"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.*", max_size=8),
).map("".join)
_TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BARE_ITEM = st.one_of(
    st.integers(-(10**15) + 1, 10**15 - 1).map(str),
    st.decimals(-(10**11), 10**11, places=3, allow_nan=False, allow_infinity=False).map(
        lambda d: f"{d:.3f}"
    ),
    st.text(alphabet=PRINTABLE + " ", max_size=12).map(sf_string),  # spaces, ";" and "=" too
    st.tuples(
        st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ*"),
        st.text(alphabet=_TCHAR + ":/", max_size=8),
    ).map("".join),
    st.binary(max_size=9).map(lambda b: ":" + base64.b64encode(b).decode() + ":"),
    st.sampled_from(["?0", "?1"]),
)
PARAMETERS = st.lists(
    st.tuples(st.sampled_from(["", " ", "  "]), _PARAM_KEY, st.none() | _BARE_ITEM).map(
        lambda p: f";{p[0]}{p[1]}" + ("" if p[2] is None else f"={p[2]}")
    ),
    min_size=1,
    max_size=4,
).map("".join)
"""RFC 8941 3.1.2: ``*( ";" *SP key [ "=" bare-item ] )``, every kind of bare item."""


@PROPERTY
@given(printable_keys(), PARAMETERS)
@example("abc", ";v=1")
@example("abc", ";a")
@example("abc", ';a="x; y=z"')
@example("abc", ";a=:AQID:")
def test_an_sf_strings_parameters_are_ignored(key: str, parameters: str) -> None:
    is_key(sf_string(key) + parameters, key)


def _uuid_of(version: int, value: int) -> uuid.UUID:
    """A UUID of ``version`` (RFC 9562's layout: its version nibble, the variant 10)."""
    value &= ~(0xF << 76) & ~(0x3 << 62)
    return uuid.UUID(int=value | (version << 76) | (0x2 << 62))


UUIDS = st.one_of(
    *(st.uuids(version=v) for v in (1, 2, 3, 4, 5)),  # type: ignore[arg-type]
    *(st.integers(0, 2**128 - 1).map(lambda n, v=v: _uuid_of(v, n)) for v in (6, 7, 8)),
    st.just(uuid.uuid1()),
    st.just(uuid.uuid3(uuid.NAMESPACE_URL, "https://idemctl.dev/")),
    st.just(uuid.uuid5(uuid.NAMESPACE_DNS, "idemctl.dev")),
    st.just(uuid.UUID(int=0)),
    st.just(uuid.UUID(int=2**128 - 1)),
)


@PROPERTY
@given(UUIDS)
def test_uuids_of_every_version_are_keys(value: uuid.UUID) -> None:
    for text in (str(value), str(value).upper(), value.hex, value.urn, f"{{{value}}}"):
        is_key(text, text)
        is_key(sf_string(text), text)


@PROPERTY
@given(st.binary(min_size=1, max_size=189))
@example(bytes.fromhex("abcdef1234567890"))
@example(b"\xfb\xff")
def test_base64_standard_and_url_safe_are_keys(data: bytes) -> None:
    for text in (
        base64.b64encode(data).decode(),
        base64.urlsafe_b64encode(data).decode(),
        base64.urlsafe_b64encode(data).decode().rstrip("="),
    ):
        is_key(text, text)
        is_key(sf_string(text), text)


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(value: int) -> str:
    """A ULID: 128 bits in Crockford's base32, 26 characters (the first 0-7)."""
    return "".join(CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


@PROPERTY
@given(st.integers(0, 2**128 - 1))
@example(0)
@example(2**128 - 1)
def test_ulids_are_keys(value: int) -> None:
    text = ulid(value)
    assert len(text) == 26 and text[0] in "01234567"
    is_key(text, text)
    is_key(text.lower(), text.lower())
    is_key(sf_string(text), text)


def test_stripe_pythons_own_keys_are_keys() -> None:
    """stripe-python 16 makes each POST's key with ``_generate_idempotency_key``: 16 random
    bytes as a bare UUID (10 in 16 start with a digit)."""
    from stripe._api_requestor import _generate_idempotency_key

    keys = [_generate_idempotency_key() for _ in range(2000)]
    assert sum(k[0].isdigit() for k in keys) > 0
    refused = [k for k in keys if key_of(OPTIONS, k) != k]
    assert not refused, f"{len(refused)} of {len(keys)} refused, e.g. {refused[:3]}"


# Refused -------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["", " ", "\t", '""', '"";v=1', '  ""  '])
def test_an_empty_key_is_refused(raw: str) -> None:
    is_refused(raw)


@PROPERTY
@given(printable_keys(256, 600).filter(lambda k: not k.startswith('"')))
@example("k" * 256)
def test_a_key_over_255_characters_is_refused(key: str) -> None:
    is_refused(key)
    is_refused(sf_string(key))


@PROPERTY
@given(printable_keys(), st.sampled_from([*CONTROL, "\t"]), printable_keys())
@example("a", "\x00", "b")
@example("a", "\t", "b")
@example("a", "\x7f", "b")
@example("a", "\r\n", "b")
def test_a_control_character_in_a_key_is_refused(head: str, control: str, tail: str) -> None:
    is_refused(head + control + tail)
    is_refused(sf_string(head + control + tail))
    if control != "\t":  # a tab around the value is the field's whitespace
        is_refused(control + head)


@PROPERTY
@given(
    st.text(alphabet=PRINTABLE, max_size=20),
    st.characters(min_codepoint=0x80),
    st.text(alphabet=PRINTABLE, max_size=20),
)
@example("caf", "\xe9", "")
@example("", "\u2028", "k")
@example("k", "\U0001f511", "")
def test_a_non_ascii_character_in_a_key_is_refused(head: str, char: str, tail: str) -> None:
    is_refused(head + char + tail)
    is_refused(sf_string(head + char + tail))


# On real servers -----------------------------------------------------------------------------


def real_keys() -> list[tuple[str, str]]:
    """(header value, what a client would call its key): one of each kind, unique."""
    from stripe._api_requestor import _generate_idempotency_key

    u4, data = uuid.uuid4(), uuid.uuid4().bytes
    return [
        (_generate_idempotency_key(), "stripe-python's"),
        (str(u4), "uuid4"),
        ("9" + str(uuid.uuid1())[1:], "uuid1 starting with a digit"),
        (base64.b64encode(data + b"\xfb").decode(), "base64"),
        (base64.urlsafe_b64encode(data + b"\xfb").decode().rstrip("="), "base64 url-safe"),
        (ulid(uuid.uuid4().int), "ULID"),
        (f"order {u4.hex[:8]} attempt 1", "inner spaces"),
        (sf_string(f'say "hi" {u4.hex[:8]} \\o/'), "sf-string with escapes"),
        (sf_string(f"k-{u4.hex[:8]}") + ";v=1;trace=:AQID:", "sf-string with parameters"),
    ]


@pytest.mark.parametrize("kind", SERVERS)
def test_real_keys_charge_once_and_replay(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with serve(kind, store_url(request, "sqlite", tmp_path), tmp_path) as served:
        refused = []
        for header, what in real_keys():
            order = unique("key")
            first = served.charge(None, order, header=header)
            if first.status_code == 400:
                refused.append((what, header, first.json().get("title")))
                continue
            assert first.status_code == 201, (what, header, first.text)
            again = served.charge(None, order, header=header)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.content == first.content, (what, header)
            assert served.charges(order) == 1, (what, header)
        assert not refused, refused


FOLDED = pytest.mark.xfail(
    strict=True,
    reason="WSGI folds repeated fields into one (PEP 3333; gunicorn joins them with ','): "
    "'a-1,a-2' is then one printable key, which a key may be",
)


@pytest.mark.parametrize("kind", ["uvicorn", pytest.param("gunicorn", marks=FOLDED)])
@pytest.mark.parametrize("values", [("a-1", "a-2"), ("same", "same")])
def test_two_key_header_fields_are_refused(
    kind: str, values: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two ``Idempotency-Key:`` lines: which one is the key? 400, saying so (ASGI: the
    server hands the app each field; under WSGI the server has joined them already)."""
    with serve(kind, store_url(request, "sqlite", tmp_path), tmp_path) as served:
        order = unique("twokeys")
        headers = [("content-type", "application/json")]
        headers += [("idempotency-key", v) for v in values]
        body = b'{"order": "%s", "amount": 500}' % order.encode()
        answer = served.client.post("/charges", content=body, headers=headers)
        doc = problem(answer, 400, "invalid-key")
        assert "one header field" in doc["detail"], doc
        assert served.charges(order) == 0
