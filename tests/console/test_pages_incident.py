"""Issue 59's findings 7, 8 and 9 over HTTP, against real ``idemctl console`` processes:
keys shown unambiguously (invisible and bidirectional characters escaped), pages made for
the incident (what a key's state means and what to do, relative times, error and retriable
columns, sorting, sweeps with an older-than field, a message after each action, the
outbox's rows, audit's known groups and topics, a form that survives its error, a lost
key's page, no log-out without a login), the overview's last hour and the bulk actions'
form. The browser's side is tests/console/test_browser_incident.py."""

from __future__ import annotations

import html as htmllib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from idemctl import open_store
from idemctl.model import ClaimRequest
from tests.backends import expire_lease, unique_schema
from tests.console.conftest import PASSWORDS, ConsoleProcess
from tests.console.test_pages import log_in
from tests.polling import wait_until
from tests.servers import KafkaBroker

HIDDEN = {
    "zero-width space": "\u200b",
    "byte order mark": "\ufeff",
    "right-to-left override": "\u202e",
    "left-to-right isolate": "\u2066",
    "pop directional isolate": "\u2069",
    "left-to-right mark": "\u200e",
    "right-to-left mark": "\u200f",
    "Arabic letter mark": "\u061c",
    "no-break space": "\u00a0",
    "line separator": "\u2028",
    "Hangul filler": "\u3164",
    "word joiner": "\u2060",
}
"""Characters that show as nothing, or turn the text around them: each makes a key of its
own, ``inv<char>key``, beside the plain ``invkey``."""
TIME = r'<time datetime="[^"]+Z" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"'
"""A ``<time>`` with its absolute time in its title."""
FAILED_ERROR = "card declined: gateway timeout"
FINAL_ERROR = "invalid card number"


def hidden_key(char: str) -> str:
    return f"inv{char}key"


def code_of(char: str) -> str:
    return f"\\u{ord(char):04x}"


def text_of(page: str) -> str:
    """The page's text as a reader sees it: tags gone, entities decoded, spaces folded."""
    page = re.sub(r"(?s)<(script|style|head)\b.*?</\1>", " ", page)
    page = re.sub(r"</?(span|time|code|strong|q|a|em)\b[^>]*>", "", page)  # inline: no space
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", page))).strip()


def fill(store: Any) -> None:
    """Stale (10 and 20 minutes), live, released, completed, failed (retriable and not),
    and the keys with hidden characters (held, and one completed)."""
    store.provision()
    held = ["pay-stuck-1", "pay-stuck-2", "pay-live-3", "pay-released-4"]
    store.claim_many([ClaimRequest(k) for k in held], lease=3600)
    expire_lease(store, "pay-stuck-1", ago=600)
    expire_lease(store, "pay-stuck-2", ago=1200)
    released = store.get("pay-released-4")
    store.release("pay-released-4", released.owner, released.fencing_token)
    done = store.claim("pay-done-5", lease=3600)
    store.complete("pay-done-5", done.owner, done.fencing_token, {"charge": "ch_5"})
    for key, error, retriable in (
        ("pay-failed-6", FAILED_ERROR, True),
        ("pay-final-7", FINAL_ERROR, False),
    ):
        attempt = store.claim(key, lease=3600)
        store.fail(key, attempt.owner, attempt.fencing_token, error, retriable=retriable)
    store.claim_many(
        [ClaimRequest("invkey")] + [ClaimRequest(hidden_key(c)) for c in HIDDEN.values()],
        lease=3600,
    )
    finished = store.claim("inv\u200bdone", lease=3600)
    store.complete("inv\u200bdone", finished.owner, finished.fencing_token, None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("incident")


@pytest.fixture(scope="module")
def store_url(folder: Path) -> str:
    url = f"sqlite:///{folder}/keys.db"
    with open_store(url) as store:
        fill(store)
    return url


@pytest.fixture(scope="module")
def console(store_url: str, folder: Path) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(store_url, folder, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def ana(console: ConsoleProcess) -> httpx.Client:
    return log_in(console.base, "ana", PASSWORDS["ana"])


def confirmed(client: httpx.Client, action: str, params: dict[str, str]) -> httpx.Response:
    """The action done as a browser does it: its dry run's page, then its form posted back
    with every field the page put there and the confirmation it asked for typed."""
    page = client.get(f"/actions/{action}", params=params)
    assert page.status_code == 200, page.text
    form = re.search(r'(?s)<form[^>]*id="confirm-form"[^>]*>(.*?)</form>', page.text)
    assert form is not None, page.text
    fields = {
        htmllib.unescape(name): htmllib.unescape(value)
        for name, value in re.findall(
            r'<input type="hidden" name="([^"]*)" value="([^"]*)"', form.group(1)
        )
    }
    expected = re.search(r'id="expected">(.*?)</code>', page.text)
    assert expected is not None, page.text
    fields["confirm"] = text_of(expected.group(1))
    return client.post(f"/actions/{action}", data=fields)


# Finding 7: keys shown unambiguously -------------------------------------------------------


def test_invisible_and_bidirectional_characters_are_shown_escaped(
    ana: httpx.Client,
) -> None:
    listing = ana.get("/keys", params={"prefix": "inv"})
    assert listing.status_code == 200
    shown = [text_of(a) for a in re.findall(r'(?s)<a class="key"[^>]*>(.*?)</a>', listing.text)]
    assert len(shown) == len(HIDDEN) + 2 and len(set(shown)) == len(shown), shown  # none alike
    for name, char in HIDDEN.items():
        key = hidden_key(char)
        assert char not in listing.text, name  # not even in an attribute
        assert f"inv{code_of(char)}key" in shown, name
        page = ana.get(f"/keys/{quote(key, safe='')}")
        assert page.status_code == 200, name
        assert char not in page.text, name
        heading = re.search(r'(?s)<code id="key-name">(.*?)</code>', page.text)
        assert heading is not None and '<span class="esc"' in heading.group(1), name
        assert text_of(heading.group(1)) == f"inv{code_of(char)}key", name
    assert "invkey" in shown  # the plain one as it is


def test_a_confirmation_its_message_and_the_log_show_the_key_escaped(
    ana: httpx.Client,
) -> None:
    key = "inv\u200bdone"
    page = ana.get("/actions/forget", params={"key": key})
    subject = re.search(r'(?s)<code id="subject">(.*?)</code>', page.text)
    assert subject is not None and text_of(subject.group(1)) == "inv\\u200bdone", page.text
    done = confirmed(ana, "forget", {"key": key})
    assert done.status_code == 303
    landed = ana.get(done.headers["location"]).text
    flash = re.search(r'(?s)<p class="flash[^"]*" id="flash">(.*?)</p>', landed)
    assert flash is not None and "inv\\u200bdone" in text_of(flash.group(1)), landed
    log = re.search(r'(?s)<table class="list" id="log">(.*?)</table>', landed)
    assert log is not None and "inv\\u200bdone" in text_of(log.group(1))
    assert "\u200b" not in landed


# Finding 8: made for the incident ----------------------------------------------------------


def test_a_stale_key_says_for_how_long_whose_lease_and_what_unlock_does(
    ana: httpx.Client, store_url: str
) -> None:
    with open_store(store_url) as store:
        record = store.get("pay-stuck-2")
    assert record is not None and record.owner is not None
    page = ana.get("/keys/pay-stuck-2").text
    state = re.search(r'id="state">([^<]*)<', page)
    assert state is not None and state.group(1) == "stale"
    meaning = re.search(r'(?s)<section[^>]*id="meaning">(.*?)</section>', page)
    assert meaning is not None, page
    said = text_of(meaning.group(1))
    assert re.search(r"Stale for 2\d min, since (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC", said), said
    assert record.owner in said and f"attempt {record.attempts}" in said
    assert f"takes it over and runs the handler again, as attempt {record.attempts + 1}" in said
    assert "Unlock frees it now" in said and str(record.fencing_token + 1) in said
    # The absolute time of the lease's end, in a title.
    assert re.search(TIME + r">2\d min</time>", page), page


def test_a_released_key_says_what_happens_next(ana: httpx.Client) -> None:
    page = ana.get("/keys/pay-released-4").text
    assert re.search(r'id="state">released<', page), page
    said = text_of(page)
    assert "in progress with no owner" in said
    assert "The next delivery of this key claims it at once and runs the handler" in said


def test_a_failed_key_says_its_error_and_whether_it_will_be_retried(ana: httpx.Client) -> None:
    retried = text_of(ana.get("/keys/pay-failed-6").text)
    assert FAILED_ERROR in retried and "It will be retried" in retried
    final = ana.get("/keys/pay-final-7").text
    assert re.search(r'id="state">failed for good<', final)
    said = text_of(final)
    assert FINAL_ERROR in said and "It will not be retried" in said
    assert "gets this failure back without running the handler" in said


def test_a_live_and_a_completed_key_say_what_the_next_delivery_does(ana: httpx.Client) -> None:
    live = text_of(ana.get("/keys/pay-live-3").text)
    assert "waits for it (busy)" in live and re.search(r"lease ends in (59|60) min", live), live
    done = text_of(ana.get("/keys/pay-done-5").text)
    assert "returns the stored result without running the handler" in done


def test_the_keys_list_shows_error_and_retriable_and_sorts_by_a_column(
    ana: httpx.Client,
) -> None:
    page = ana.get("/keys", params={"status": "failed"}).text
    head = re.search(r"(?s)<table class=\"list\" id=\"keys\">\s*<tr>(.*?)</tr>", page)
    assert head is not None and "error" in text_of(head.group(1))
    assert "retriable" in text_of(head.group(1))
    rows = {
        text_of(m.group(1)): text_of(m.group(0))
        for m in re.finditer(r'(?s)<a class="key"[^>]*>(.*?)</a>.*?</tr>', page)
    }
    assert FAILED_ERROR in rows["pay-failed-6"] and " yes " in f"{rows['pay-failed-6']} "
    assert FINAL_ERROR in rows["pay-final-7"] and " no " in f"{rows['pay-final-7']} "
    # Sorted on the server, by a query parameter, ascending and descending.
    by_error = ana.get("/api/keys", params={"prefix": "pay-", "sort": "error"}).json()["items"]
    assert [r["key"] for r in by_error][:2] == ["pay-failed-6", "pay-final-7"]
    by_updated = ana.get("/api/keys", params={"prefix": "pay-", "sort": "-updated"}).json()
    times = [r["updated_at"] for r in by_updated["items"]]
    assert times == sorted(times, reverse=True)
    sorted_page = ana.get("/keys", params={"prefix": "pay-", "sort": "-key"}).text
    keys = [text_of(k) for k in re.findall(r'(?s)<a class="key"[^>]*>(.*?)</a>', sorted_page)]
    assert keys == sorted(keys, reverse=True) and len(keys) == 7
    assert 'href="/keys?prefix=pay-&amp;sort=key"' in sorted_page  # the header flips it


def test_a_bad_search_keeps_its_form(ana: httpx.Client) -> None:
    for params in ({"sort": "colour"}, {"older_than": "soon"}):
        page = ana.get("/keys", params=params)
        assert page.status_code == 400
        assert 'id="search"' in page.text and 'id="failure"' in page.text, params


def test_times_are_relative_with_the_absolute_time_in_a_title(ana: httpx.Client) -> None:
    page = ana.get("/keys", params={"prefix": "pay-stuck-2"}).text
    assert re.search(TIME + r">2\d min ago</time>", page), page  # the lease's end


def test_sweeps_take_an_older_than_field(ana: httpx.Client) -> None:
    overview = ana.get("/").text
    form = re.search(r'(?s)<form[^>]*action="/actions/unlock-stale"[^>]*>(.*?)</form>', overview)
    assert form is not None and 'name="older_than"' in form.group(1), overview
    assert re.search(r'(?s)<form[^>]*action="/actions/purge"[^>]*>.*?name="older_than"', overview)
    preview = ana.get("/api/actions/unlock-stale", params={"older_than": "15m"}).json()
    assert preview["keys"] == ["pay-stuck-2"]  # the lease that ran out 20 min ago, not 10


def test_an_action_leaves_its_result_on_the_page_it_lands_on(
    console: ConsoleProcess, ana: httpx.Client
) -> None:
    done = confirmed(ana, "unlock", {"key": "pay-stuck-1"})
    assert done.status_code == 303
    landed = ana.get(done.headers["location"])
    assert landed.status_code == 200
    flash = re.search(r'(?s)<p class="flash ok" id="flash">(.*?)</p>', landed.text)
    assert flash is not None, landed.text
    said = text_of(flash.group(1))
    assert "unlock" in said and "pay-stuck-1" in said and "1 done" in said, said
    assert 'href="/keys/pay-stuck-1"' in flash.group(1)
    # What the key is now, from the message's link: released, and what happens next.
    after = ana.get("/keys/pay-stuck-1").text
    assert re.search(r'id="state">released<', after)
    # A message is the console's own: a made-up one shows nothing.
    assert 'id="flash"' not in ana.get("/log", params={"flash": "made-up"}).text
    assert 'id="flash"' not in ana.get("/log").text


def test_a_store_without_an_outbox_says_so_and_offers_no_link(ana: httpx.Client) -> None:
    overview = ana.get("/").text
    assert 'href="/outbox"' not in overview
    page = ana.get("/outbox")
    assert page.status_code == 200 and 'id="no-outbox"' in page.text
    assert "PostgreSQL" in text_of(page.text)


def test_no_log_out_without_a_login(store_url: str, tmp_path: Path, ana: httpx.Client) -> None:
    assert 'action="/logout"' in ana.get("/").text
    local = ConsoleProcess(store_url, tmp_path, "--no-auth")
    try:
        page = httpx.get(f"{local.base}/")
        assert page.status_code == 200 and "local (operator" in page.text
        assert 'action="/logout"' not in page.text and "log out" not in page.text
    finally:
        local.stop()


# Finding 9: the last hour, bulk actions' form ----------------------------------------------


def test_the_overview_shows_the_last_hour_as_the_console_sampled_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "try:\n    import idemctl.console.sampler as sampler\n    sampler.INTERVAL = 1.0\n"
        "except ImportError:\n    pass\n"
    )
    url = f"sqlite:///{tmp_path}/hour.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest(f"h-{i}") for i in range(5)], lease=3600)
    process = ConsoleProcess(url, tmp_path, path=tmp_path)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        with open_store(url) as store:
            for i in range(3):
                held = store.get(f"h-{i}")
                store.complete(f"h-{i}", held.owner, held.fencing_token, None)
            held = store.get("h-3")
            store.fail("h-3", held.owner, held.fencing_token, "boom", retriable=True)
            expire_lease(store, "h-4", ago=60)
        seen: dict[str, Any] = {}

        def counted() -> bool:
            seen["history"] = ana.get("/api/").json().get("history") or {}
            steps = seen["history"].get("steps", [])
            return sum(s["completed"] or 0 for s in steps) >= 3 and steps[-1]["stale"] == 1

        wait_until(
            counted,
            "the history counts 3 completed and 1 stale",
            interval=0.2,
            detail=lambda: repr(seen.get("history")),
        )
        history = seen["history"]
        steps = history["steps"]
        assert sum(s["failed"] or 0 for s in steps) == 1
        assert history["interval_seconds"] == pytest.approx(1.0)
        page = ana.get("/").text
        for series in ("completed", "failed", "stale"):
            chart = re.search(
                rf'(?s)<svg class="chart {series}" id="chart-{series}".*?</svg>', page
            )
            assert chart is not None, series
            assert 'class="bar"' in chart.group(0) and "<script" not in chart.group(0)
            assert "style=" not in chart.group(0)  # the CSP allows no inline style
        chart = re.search(r'(?s)<svg class="chart completed".*?</svg>', page)
        assert chart is not None
        assert sum(int(v) for v in re.findall(r'data-value="(\d+)"', chart.group(0))) == 3
        assert re.search(r"<title>\d\d:\d\d UTC: [123] completed</title>", chart.group(0))
    finally:
        process.stop()


def test_the_keys_list_has_a_bulk_form_for_operators_only(
    ana: httpx.Client, console: ConsoleProcess
) -> None:
    page = ana.get("/keys", params={"prefix": "pay-"}).text
    boxes = re.findall(
        r'<input type="checkbox" class="pick" name="key" value="([^"]*)" form="bulk"', page
    )
    assert len(boxes) == 7
    assert re.search(r'<form method="get" action="/actions/bulk-unlock" id="bulk">', page)
    assert 'formaction="/actions/bulk-unlock"' in page
    assert 'formaction="/actions/bulk-forget"' in page
    bo = log_in(console.base, "bo", PASSWORDS["bo"])
    viewer = bo.get("/keys", params={"prefix": "pay-"}).text
    assert 'class="pick"' not in viewer and "bulk-unlock" not in viewer


# With PostgreSQL's outbox and a broker -----------------------------------------------------


def test_the_outbox_lists_unpublished_and_failing_rows_and_replays_from_one(
    postgres_server: Any, tmp_path: Path
) -> None:
    from idemctl.outbox import add
    from tests.outbox.test_outbox import drop_schema

    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    try:
        with open_store(url) as store:
            store.provision()
            with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                rows = [add(conn, "order", f"o-{i}", "OrderPlaced", {"n": i}, schema=schema)
                        for i in range(3)]  # fmt: skip
            table = store.names.outbox_table  # type: ignore[attr-defined]
            with store.connection() as conn:  # type: ignore[attr-defined]
                conn.execute(
                    f"UPDATE {table} SET attempts = 2, last_error = %s WHERE id = %s",
                    ("broker down: <timeout>", rows[1]),
                )
                conn.execute(f"UPDATE {table} SET published_at = now() WHERE id = %s", (rows[2],))
        process = ConsoleProcess(url, tmp_path, "--allow-repair")
        try:
            ana = log_in(process.base, "ana", PASSWORDS["ana"])
            page = ana.get("/outbox").text
            failing = re.search(r'(?s)<table [^>]*id="failing-rows">(.*?)</table>', page)
            pending = re.search(r'(?s)<table [^>]*id="unpublished-rows">(.*?)</table>', page)
            assert failing is not None and pending is not None, page
            assert str(rows[1]) in failing.group(1) and str(rows[0]) not in failing.group(1)
            assert "broker down: <timeout>" in text_of(failing.group(1))
            assert "<timeout>" not in page  # escaped
            assert str(rows[0]) in pending.group(1) and str(rows[1]) in pending.group(1)
            assert str(rows[2]) not in page  # published
            form = re.search(
                rf'<form method="get" action="/actions/replay"[^>]*><input type="hidden" '
                rf'name="id" value="{rows[0]}">',
                pending.group(1),
            )
            assert form is not None
            preview = ana.get("/actions/replay", params={"id": str(rows[0])})
            assert preview.status_code == 200 and str(rows[0]) in preview.text
            listed = ana.get("/api/outbox/rows").json()
            assert [r["id"] for r in listed["failing"]] == [str(rows[1])]
            assert [r["id"] for r in listed["unpublished"]] == [str(rows[0]), str(rows[1])]
        finally:
            process.stop()
    finally:
        drop_schema(postgres_server, schema)


@pytest.fixture(scope="module")
def audited(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A group that committed past five messages, two of them done: a console with
    ``--brokers``."""
    from tests.audit.test_audit import commit, keyed, produce
    from tests.consume.test_consume import names

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, keyed(5))
    commit(kafka_broker, topic, group, {0: 5})
    folder = tmp_path_factory.mktemp("audited")
    url = f"sqlite:///{folder}/audit.db"
    with open_store(url) as store:
        store.provision()
        for key in ("k-0", "k-1"):
            attempt = store.claim(key, lease=60)
            store.complete(key, attempt.owner, attempt.fencing_token, None)
        attempt = store.claim("k-2", lease=3600)
        expire_lease(store, "k-2", ago=300)
    process = ConsoleProcess(url, folder, "--brokers", kafka_broker.bootstrap)
    try:
        yield process, topic, group
    finally:
        process.stop()


def test_audit_offers_the_groups_and_topics_the_brokers_know(audited: Any) -> None:
    process, topic, group = audited
    ana = log_in(process.base, "ana", PASSWORDS["ana"])
    page = ana.get("/audit").text
    groups = re.search(r'(?s)<datalist id="known-groups">(.*?)</datalist>', page)
    topics = re.search(r'(?s)<datalist id="known-topics">(.*?)</datalist>', page)
    assert groups is not None and topics is not None, page
    assert f'<option value="{group}">' in groups.group(1)
    assert f'<option value="{topic}">' in topics.group(1)
    assert 'list="known-groups"' in page and 'list="known-topics"' in page


def test_an_audit_error_keeps_the_form(audited: Any) -> None:
    process, topic, _ = audited
    ana = log_in(process.base, "ana", PASSWORDS["ana"])
    page = ana.get("/audit", params={"group": f"nobody-{uuid.uuid4().hex[:6]}", "topic": topic})
    assert page.status_code == 400
    assert 'id="audit-form"' in page.text and 'id="audit-error"' in page.text
    assert "has committed nothing" in text_of(page.text)
    assert f'value="{topic}"' in page.text  # what was typed stays


def test_a_lost_key_links_to_what_is_known_of_it(audited: Any) -> None:
    process, topic, group = audited
    ana = log_in(process.base, "ana", PASSWORDS["ana"])
    page = ana.get("/audit", params={"group": group, "topic": topic}).text
    lost = re.search(r'(?s)<table class="list" id="lost">(.*?)</table>', page)
    assert lost is not None, page
    links = {
        text_of(t): htmllib.unescape(h)
        for h, t in re.findall(r'<a [^>]*href="([^"]*)"[^>]*>(.*?)</a>', lost.group(1))
    }
    assert set(links) == {"k-2", "k-3", "k-4"}, page
    absent = ana.get(links["k-4"])
    assert absent.status_code == 200, absent.text
    said = text_of(absent.text)
    assert "no record of the key" in said and topic in said and "offset 4" in said
    stale = ana.get(links["k-2"])
    assert stale.status_code == 200 and re.search(r'id="state">stale<', stale.text)
    assert 'href="/keys/k-2"' in stale.text
