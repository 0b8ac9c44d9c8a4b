"""stripe-python 16 against an imitation of Stripe's ``POST /v1/charges`` behind the
middleware (tests/http/stripe_app.py), under uvicorn (ASGI) and gunicorn (WSGI) on Redis:
the keys stripe-python makes itself are accepted, and each charge happens once through the
faults its retries are for.

What stripe-python 16.1 does (its source: stripe/_api_requestor.py, stripe/_http_client.py):

- Every POST gets an ``Idempotency-Key`` unless the caller gives one:
  ``_generate_idempotency_key()``, 16 random bytes written as a bare UUID
  (``8-4-4-4-12`` hex digits, no version bits): 10 times in 16 it starts with a digit.
- Retries: ``stripe.max_network_retries`` is 2 for the module-level API
  (``stripe.Charge.create``); a ``StripeClient`` made without ``max_network_retries``
  retries **0** times (its options hold None, and ``_should_retry`` counts None as 0), so
  these tests give the client 2, the module's default. A retry reuses the key. It retries a
  connection error or a timeout (requests' ``ConnectionError``/``Timeout``), a 409 and any
  5xx (unless ``Stripe-Should-Retry: false``); never a 400. It sleeps 0.5 s * 2^(n-1)
  (at most 5 s), jittered to half of that at least, and no less than 0.5 s.
- Its requests client times out after 80 s unless given ``timeout``.

The app runs with ``IDEMCTL_WAIT`` (a duplicate in flight waits for the first request's
answer rather than getting a 409): the retry of a request slower than the client's timeout
then gets the first one's answer however loaded the machine is, within its own timeout.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import stripe

from tests.http.conftest import SERVERS, Served, serve, store_url, unique

pytestmark = pytest.mark.timeout(300)

APPS = {"uvicorn": "tests.http.stripe_app:asgi", "gunicorn": "tests.http.stripe_app:wsgi"}
RETRIES = 2
"""The module-level API's default (``stripe.max_network_retries``), given to StripeClient."""
TIMEOUT = 2.0
"""The client's timeout in the fault tests (seconds)."""
SLOW = TIMEOUT + 1.5
"""How long a ``slow`` charge sleeps: past the client's timeout, within twice it."""
CREATES = 200


@dataclass
class Sent:
    """One HTTP request stripe-python sent: its key and what came back (None: no answer,
    a connection error or a timeout)."""

    key: str
    status: int | None
    replayed: bool = False
    error: str = ""


class Recording(stripe.RequestsClient):  # type: ignore[misc]
    """stripe-python's own requests client, recording each try (retries included)."""

    def __init__(self, timeout: float = 80.0) -> None:
        super().__init__(timeout=timeout)
        self.sent: list[Sent] = []
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        key = (headers or {}).get("Idempotency-Key", "")
        try:
            content, status, answer = super().request(method, url, headers, post_data, **kwargs)
        except stripe.APIConnectionError as exc:
            with self._lock:
                self.sent.append(Sent(key, None, error=str(exc).splitlines()[-1]))
            raise
        replayed = answer.get("idempotent-replayed") == "true"
        with self._lock:
            self.sent.append(Sent(key, status, replayed))
        return content, status, answer


@pytest.fixture(scope="module", params=SERVERS)
def app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    kind = request.param
    directory = tmp_path_factory.mktemp(f"stripe-{kind}")
    url = store_url(request, "redis", directory)
    env = {"IDEMCTL_WAIT": "30"}
    with serve(kind, url, directory, app=APPS[kind], env=env) as running:
        yield running


def use_module_api(app: Served, monkeypatch: pytest.MonkeyPatch, timeout: float) -> Recording:
    """``stripe.Charge.create`` on the app, with the module's default retries."""
    client = Recording(timeout=timeout)
    monkeypatch.setattr(stripe, "api_key", "sk_test_x")
    monkeypatch.setattr(stripe, "api_base", app.server.base_url)
    monkeypatch.setattr(stripe, "default_http_client", client)
    assert stripe.max_network_retries == RETRIES  # the module's default, left as it is
    return client


@pytest.fixture
def module_api(app: Served, monkeypatch: pytest.MonkeyPatch) -> Recording:
    """The module-level API with the fault tests' timeout."""
    return use_module_api(app, monkeypatch, TIMEOUT)


def client_of(app: Served, recording: Recording) -> stripe.StripeClient:
    return stripe.StripeClient(
        "sk_test_x",
        base_addresses={"api": app.server.base_url},
        max_network_retries=RETRIES,
        http_client=recording,
    )


def params(order: str, **metadata: str) -> dict[str, Any]:
    return {
        "amount": 500,
        "currency": "usd",
        "source": "tok_visa",
        "metadata": {"order": order, **metadata},
    }


def test_stripe_client_retries_nothing_unless_told() -> None:
    """What the module's docstring says of the defaults, read off the installed library."""
    from stripe._api_requestor import _generate_idempotency_key

    assert stripe.max_network_retries == 2
    bare = stripe.StripeClient("sk_test_x")
    assert bare._requestor._options.max_network_retries is None
    assert not bare._requestor._client._should_retry(None, _retryable(), 0, None)
    key = _generate_idempotency_key()
    assert [len(part) for part in key.split("-")] == [8, 4, 4, 4, 12]


def _retryable() -> stripe.APIConnectionError:
    return stripe.APIConnectionError("reset", should_retry=True)


def test_200_creates_with_stripes_own_keys_are_none_refused(
    app: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half through ``stripe.Charge.create``, half through a StripeClient; stripe-python
    makes every key (a bare UUID, most starting with a digit)."""
    module_api = use_module_api(app, monkeypatch, 80.0)
    other = Recording()
    client = client_of(app, other)
    orders = [unique("create") for _ in range(CREATES)]

    def create(i: int) -> tuple[str, Any]:
        try:
            if i % 2:
                return orders[i], client.v1.charges.create(params=params(orders[i]))
            return orders[i], stripe.Charge.create(**params(orders[i]))
        except stripe.StripeError as exc:
            return orders[i], exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(CREATES)))
    sent = module_api.sent + other.sent
    refused = [s.key for s in sent if s.status == 400]
    statuses = Counter(s.status for s in sent)
    assert not refused, (
        f"{len(refused)} of {CREATES} keys refused (400), e.g. {refused[:5]}; "
        f"statuses {dict(statuses)}"
    )
    failed = [(order, repr(r)) for order, r in results if isinstance(r, Exception)]
    assert not failed, failed[:5]
    for order, charge in results:
        assert charge.object == "charge" and charge.id.startswith("ch_")
        assert charge.metadata["order"] == order and charge.amount == 500
    assert len({s.key for s in sent}) == CREATES  # one key per create
    counts = Counter(line for line in app.server.ledger.read_text().splitlines())
    assert [order for order in orders if counts[order] != 1] == []


def charged_once(app: Served, recording: Recording, order: str, fault: str) -> list[Sent]:
    """Create ``order`` with ``fault`` through the module-level API: it ends with its
    charge, charged once; the tries stripe-python made (one key)."""
    try:
        charge = stripe.Charge.create(**params(order, fault=fault, sleep=str(SLOW)))
    except stripe.StripeError as exc:
        raise AssertionError(
            f"{fault}: stripe-python gave up: {exc!r}; tries {recording.sent}; "
            f"charged {app.charges(order)} times"
        ) from exc
    assert charge.object == "charge" and charge.metadata["order"] == order
    assert charge.metadata["fault"] == fault
    keys = {s.key for s in recording.sent}
    assert len(keys) == 1, recording.sent
    assert app.charges(order) == 1, (fault, recording.sent)
    return recording.sent


@pytest.mark.parametrize("fault", ["slow-before", "slow-after"])
def test_a_charge_slower_than_the_clients_timeout_is_made_once(
    app: Served, module_api: Recording, fault: str
) -> None:
    order = unique(fault)
    sent = charged_once(app, module_api, order, fault)
    assert sent[0].status is None and "timed out" in sent[0].error.lower(), sent
    assert sent[-1].status == 200 and sent[-1].replayed, sent


def test_a_500_once_is_retried_and_charged_once(app: Served, module_api: Recording) -> None:
    order = unique("fivehundred")
    sent = charged_once(app, module_api, order, "500once")
    assert [s.status for s in sent] == [500, 200], sent
    assert not sent[-1].replayed  # the 500 was not stored: the retry ran the charge


def test_a_connection_reset_after_the_charge_is_retried_and_charged_once(
    app: Served, module_api: Recording
) -> None:
    order = unique("reset")
    sent = charged_once(app, module_api, order, "reset")
    assert sent[0].status is None and "reset" in sent[0].error.lower(), sent
    assert [s.status for s in sent[1:]] == [200] and sent[1].replayed, sent


def test_the_faults_at_once_through_a_stripe_client(app: Served) -> None:
    """Every fault in parallel, through a StripeClient (its own key per create)."""
    recording = Recording(timeout=TIMEOUT)
    client = client_of(app, recording)
    faults = ["slow-before", "slow-after", "500once", "reset", ""] * 2
    orders = [unique(f"both-{fault or 'none'}") for fault in faults]

    def create(i: int) -> Any:
        extra = {"fault": faults[i], "sleep": str(SLOW)} if faults[i] else {}
        try:
            return client.v1.charges.create(params=params(orders[i], **extra))
        except stripe.StripeError as exc:
            return exc

    with ThreadPoolExecutor(len(faults)) as pool:
        results = list(pool.map(create, range(len(faults))))
    failed = [(orders[i], repr(r)) for i, r in enumerate(results) if isinstance(r, Exception)]
    assert not failed, (failed, recording.sent)
    assert [r.metadata["order"] for r in results] == orders
    assert {order: app.charges(order) for order in orders} == dict.fromkeys(orders, 1)


def test_the_app_answers_stripes_error_shape(app: Served) -> None:
    """A create without ``metadata[order]`` is the app's own 400, in Stripe's shape, and
    stripe-python reads it as an InvalidRequestError (a key of letters: any core takes it)."""
    client = client_of(app, Recording())
    with pytest.raises(stripe.InvalidRequestError) as raised:
        client.v1.charges.create(
            params={"amount": 5, "currency": "usd", "source": "tok_visa"},
            options={"idempotency_key": unique("shape")},
        )
    assert raised.value.http_status == 400 and raised.value.param == "metadata"
