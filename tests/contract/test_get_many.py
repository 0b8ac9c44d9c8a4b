"""``get_many``: the records of many keys in one round trip, on every store (the sync API:
``audit`` is its caller)."""

from __future__ import annotations

import pytest

from idemctl import Acquired, Completion, Status
from tests.backends import BACKENDS, expire_retention


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_get_many_answers_live_records_and_leaves_out_absent_and_expired(
    request: pytest.FixtureRequest, name: str
) -> None:
    backend = BACKENDS[name](request)
    backend.reset()
    store = backend.open()
    try:
        done = store.claim("k-done", None, 60)
        held = store.claim("k-held", None, 60)
        gone = store.claim("k-gone", None, 60)
        assert isinstance(done, Acquired) and isinstance(held, Acquired)
        assert isinstance(gone, Acquired)
        store.complete_many([Completion("k-done", done.owner, done.fencing_token, {"n": 1})])
        store.complete("k-gone", gone.owner, gone.fencing_token, None, retention=60)
        expire_retention(store, "k-gone")
        many = [f"k-none-{i}" for i in range(250)]  # past DynamoDB's 100 a request
        found = store.get_many(["k-done", "k-held", "k-gone", "k-done", *many])
        assert set(found) == {"k-done", "k-held"}
        assert found["k-done"].status is Status.COMPLETED and found["k-done"].result == {"n": 1}
        assert found["k-held"].status is Status.IN_PROGRESS
        assert found["k-held"].owner == held.owner
        assert store.get_many([]) == {}
    finally:
        store.close()
