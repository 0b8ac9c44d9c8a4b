"""``timeout=`` on the library path: ``run``, ``@idempotent`` and their asyncio forms raise
HandlerTimeout in a handler still running past it; the attempt fails as retriable, and the
next call runs the key again. A handler's own HandlerTimeout or TimeoutError is its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from idemctl import HandlerTimeout, idempotent, open_store, run
from idemctl.aio import idempotent as aidempotent
from idemctl.aio import open_store as aopen_store
from idemctl.aio import run as arun
from idemctl.runner import Outcome


def _forever(ctx: object) -> None:
    while True:  # Python code: HandlerTimeout lands at once
        time.sleep(0.01)


def test_run_times_out_and_the_key_runs_again() -> None:
    with open_store("memory://") as store:
        result = run(store, "k", _forever, timeout=0.2)
        assert result.outcome is Outcome.ERROR and result.retriable
        assert isinstance(result.error, HandlerTimeout)
        assert "ran past its timeout of 200ms" in str(result.error)
        record = store.get("k")
        assert record is not None and "HandlerTimeout" in (record.error or "")
        again = run(store, "k", lambda ctx: {"ok": ctx.attempt}, timeout=5)
        assert again.outcome is Outcome.EXECUTED and again.result == {"ok": 2}


def test_a_handler_within_its_timeout_is_never_interrupted() -> None:
    with open_store("memory://") as store:
        results = [run(store, f"k{i}", lambda ctx: 1, timeout=30) for i in range(200)]
        for _ in range(10_000):
            pass
    assert {r.outcome for r in results} == {Outcome.EXECUTED}


def test_the_decorator_raises_it_and_a_later_call_runs() -> None:
    calls: list[int] = []
    with open_store("memory://") as store:

        @idempotent(store, key="charge:{n}", fingerprint=lambda n, hang: n, timeout=0.2)
        def charge(n: int, hang: bool) -> int:
            calls.append(n)
            if hang:
                _forever(None)
            return n

        with pytest.raises(HandlerTimeout):
            charge(1, True)
        assert charge(1, False) == 1 and calls == [1, 1]


def test_a_handlers_own_timeout_is_its_own() -> None:
    def own(ctx: object) -> None:
        raise HandlerTimeout("my own")

    with open_store("memory://") as store:
        result = run(store, "k", own, timeout=30)
    assert str(result.error) == "my own"


def test_asyncio_cancels_the_coroutine() -> None:
    async def main() -> None:
        async def slow(ctx: object) -> None:
            await asyncio.sleep(3600)

        async def own(ctx: object) -> None:
            raise TimeoutError("the handler's")

        store = aopen_store("memory://")
        try:
            result = await arun(store, "k", slow, timeout=0.1)
            assert isinstance(result.error, HandlerTimeout) and result.retriable
            mine = await arun(store, "k2", own, timeout=30)
            assert isinstance(mine.error, TimeoutError) and not isinstance(
                mine.error, HandlerTimeout
            )

            @aidempotent(store, key="a:{n}", timeout=0.1)
            async def charge(n: int) -> None:
                await asyncio.sleep(3600)

            with pytest.raises(HandlerTimeout):
                await charge(1)
        finally:
            await store.aclose()

    asyncio.run(main())
