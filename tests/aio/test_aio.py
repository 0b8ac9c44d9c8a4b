"""idemctl.aio beyond the contract suite (which runs on both APIs): many coroutines of one
event loop racing on a real server, the heartbeat task, cancellation, ``@idempotent`` on
``async def``, errors, and that the claim/complete path on Redis is the async client's."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from idemctl import aio
from idemctl.errors import (
    FingerprintMismatch,
    KeyBusy,
    Permanent,
    PreviouslyFailed,
    StoreUnavailable,
)
from idemctl.model import Acquired, Busy, Status
from idemctl.runner import Context, Outcome, current_context
from idemctl.stores.redis.store_async import AsyncRedisStore
from tests.backends import unique_prefix
from tests.polling import wait_until_async
from tests.servers import RedisServer, free_port


def redis_url(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"


@pytest.fixture(params=["redis", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return redis_url(request.getfixturevalue("redis_server"))
    return f"sqlite:///{tmp_path}/aio.db"


def test_coroutines_of_one_loop_race_and_each_key_runs_once(url: str) -> None:
    """16 coroutines on one event loop and one store claim the same 60 keys: every key's
    handler runs once; the others replay it or find it busy and come back."""
    keys = [f"payment-{i:02d}" for i in range(60)]
    runs: Counter[str] = Counter()

    async def worker(store: aio.AsyncStore, n: int) -> Counter[str]:
        outcomes: Counter[str] = Counter()

        async def charge(ctx: Context) -> dict[str, Any]:
            runs[ctx.key] += 1
            await store.get(ctx.key)  # I/O: other coroutines run meanwhile
            return {"by": n}

        pending = keys[n % 7 :] + keys[: n % 7]

        async def one_pass() -> bool:
            """Every pending key run once more; whether none is left busy."""
            nonlocal pending
            busy = []
            for key in pending:
                result = await aio.run(store, key, charge)
                outcomes[result.outcome.value] += 1
                if result.outcome is Outcome.BUSY:
                    busy.append(key)
            pending = busy
            return not pending

        await wait_until_async(one_pass, f"worker {n}: every key run", interval=0.005)
        return outcomes

    async def main() -> list[Counter[str]]:
        async with aio.open_store(url) as store:
            return await asyncio.gather(*(worker(store, n) for n in range(16)))

    results = asyncio.run(main())
    assert runs == dict.fromkeys(keys, 1)
    assert sum(c["executed"] for c in results) == len(keys)
    assert all(c["executed"] + c["replayed"] == len(keys) for c in results)
    assert set().union(*results) <= {"executed", "replayed", "busy"}


def test_the_heartbeat_task_keeps_a_slow_handler_s_key(url: str) -> None:
    """A handler that runs four leases long keeps its key: others find it busy, never
    take it over, and it completes on its first attempt. Four leases by the store's clock:
    the handler runs until the heartbeat has moved the lease's end three leases on."""

    async def main() -> tuple[Any, list[Any]]:
        async with aio.open_store(url) as store:
            seen: list[Any] = []

            async def slow(ctx: Context) -> str:
                first = await store.get("slow-1")
                assert first is not None and first.lease_expires_at is not None
                later = first.lease_expires_at + timedelta(seconds=3 * 0.6)

                async def three_leases_on() -> bool:
                    seen.append(await store.claim("slow-1", lease=0.6))  # another worker
                    now = await store.get("slow-1")
                    assert now is not None and now.lease_expires_at is not None
                    return now.lease_expires_at >= later

                await wait_until_async(
                    three_leases_on, "the lease's end moved on by three leases", interval=0.3
                )
                return "done"

            return await aio.run(store, "slow-1", slow, lease=0.6), seen

    result, seen = asyncio.run(main())
    assert result.outcome is Outcome.EXECUTED and result.attempt == 1
    assert seen and all(isinstance(s, Busy) for s in seen), seen


async def cancelled_then_claimed(
    store: aio.AsyncStore, key: str, handler: Any, cancel_when: Any, lease: float = 60
) -> None:
    """``aio.run`` of ``handler`` (lease 60 s), cancelled once ``cancel_when`` is set: the
    run ends cancelled and the key is given back at once, a takeover (attempt 2: the
    handler had started, and may have done part of its work)."""
    task = asyncio.create_task(aio.run(store, key, handler, lease=lease))
    await asyncio.wait_for(cancel_when.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # With a 60 s lease, only a release lets the next claim in now.
    again, record = await store.claim(key), await store.get(key)
    assert isinstance(again, Acquired) and again.attempt == 2 and again.takeover
    assert record is not None and record.status is Status.IN_PROGRESS


def test_a_cancelled_handler_gives_its_key_back_at_once(url: str) -> None:
    async def main() -> None:
        async with aio.open_store(url) as store:
            started = asyncio.Event()

            async def forever(ctx: Context) -> None:
                started.set()
                await asyncio.Event().wait()

            await cancelled_then_claimed(store, "cancel-1", forever, started)

    asyncio.run(main())


def test_a_cancellation_while_the_heartbeat_stops_is_not_swallowed(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is cancelled just as the handler returns, while run waits for a beat under
    way to end: run ends cancelled (the key given back), not as if nothing had happened."""
    from idemctl.aio import heartbeat

    beating, stopping = asyncio.Event(), asyncio.Event()
    runs: list[asyncio.Task[Any]] = []  # the task run (and its handler) runs in

    async def slow_to_stop(self: heartbeat.Heartbeat) -> None:
        beating.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopping.set()
            # winding down lasts until run's task is cancelled: the window
            await wait_until_async(runs[0].cancelling, "run's task is cancelled")
            raise

    monkeypatch.setattr(heartbeat.Heartbeat, "_beat", slow_to_stop)

    async def quick(ctx: Context) -> str:
        runs.append(asyncio.current_task())  # type: ignore[arg-type]
        await beating.wait()  # a beat is under way (lease 0.3 s: due at 0.1 s)
        return "done"

    async def main() -> None:
        async with aio.open_store(url) as store:
            await cancelled_then_claimed(store, "cancel-2", quick, stopping, lease=0.3)

    asyncio.run(main())


def test_a_quick_handler_makes_no_heartbeat_task(url: str) -> None:
    """A handler that ends before its first beat costs a timer, no task: the loop sees no
    task but run's own while it runs, and none is left after."""

    async def main() -> tuple[set[str], int]:
        names: set[str] = set()
        async with aio.open_store(url) as store:

            async def quick(ctx: Context) -> str:
                names.update(t.get_name() for t in asyncio.all_tasks())
                return "done"

            for i in range(20):
                await aio.run(store, f"quick-{i}", quick, lease=30)
            return names, len(asyncio.all_tasks())

    names, left = asyncio.run(main())
    assert not any(n.startswith("idemctl-heartbeat") for n in names), names
    assert left == 1  # main itself


def test_idempotent_on_async_def(url: str) -> None:
    charged: list[tuple[str, int]] = []

    async def main() -> None:
        store = aio.open_store(url)

        @aio.idempotent(store, key="charge:{order_id}")
        async def charge(order_id: str, amount: int) -> dict[str, Any]:
            assert current_context().key == f"charge:{order_id}"
            charged.append((order_id, amount))
            await asyncio.sleep(0)
            return {"charged": amount}

        @aio.idempotent(store, key="refund:{order_id}", permanent=(ValueError,))
        async def refund(order_id: str) -> None:
            raise ValueError("nothing to refund")

        assert await charge("o-1", 5) == {"charged": 5}
        assert await charge("o-1", 5) == {"charged": 5}  # replayed
        with pytest.raises(FingerprintMismatch):
            await charge("o-1", 7)
        with pytest.raises(ValueError, match="nothing to refund"):
            await refund("o-1")
        with pytest.raises(PreviouslyFailed):
            await refund("o-1")
        held = await store.claim("charge:o-2")
        assert isinstance(held, Acquired)
        with pytest.raises(KeyBusy):
            await charge("o-2", 1)
        await store.aclose()

    asyncio.run(main())
    assert charged == [("o-1", 5)]


def test_idempotent_opens_a_url_on_first_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/lazy.db"
    calls = []

    @aio.idempotent(url, key="k:{n}")
    async def once(n: int) -> int:
        calls.append(n)
        return n * 2

    async def main() -> list[int]:
        return [await once(1), await once(1), await once(2)]

    assert asyncio.run(main()) == [2, 2, 4]
    assert calls == [1, 2]


def test_plain_handlers_and_handler_errors(url: str) -> None:
    async def main() -> list[Any]:
        async with aio.open_store(url) as store:
            plain = await aio.run(store, "plain-1", lambda ctx: {"attempt": ctx.attempt})
            boom = await aio.run(store, "boom-1", _boom)
            again = await aio.run(store, "boom-1", _boom)
            final = await aio.run(store, "perm-1", _permanent)
            return [plain, boom, again, final, await store.get("perm-1")]

    plain, boom, again, final, record = asyncio.run(main())
    assert plain.outcome is Outcome.EXECUTED and plain.result == {"attempt": 1}
    assert boom.outcome is Outcome.ERROR and boom.retriable and boom.attempt == 1
    assert again.outcome is Outcome.ERROR and again.attempt == 2  # retriable: runs again
    assert final.outcome is Outcome.ERROR and not final.retriable
    assert record is not None and record.status is Status.FAILED and not record.retriable


async def _boom(ctx: Context) -> None:
    raise RuntimeError("gateway timeout")


async def _permanent(ctx: Context) -> None:
    raise Permanent("card declined")


def test_redis_claims_and_completes_on_the_async_client(redis_server: RedisServer) -> None:
    """The sync store's script calls are cut off: the claim/complete path still works, so
    it runs on redis.asyncio, not on the sync client in a thread."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sync client was called")

    async def main() -> tuple[Any, Any]:
        async with aio.open_store(redis_url(redis_server)) as store:
            assert isinstance(store, AsyncRedisStore)
            store.sync.script_runner.call = refuse  # type: ignore[method-assign]
            store.sync._read = refuse  # type: ignore[method-assign]
            result = await aio.run(store, "native-1", lambda ctx: "ok")
            return result, await store.get("native-1")

    result, record = asyncio.run(main())
    assert result.outcome is Outcome.EXECUTED
    assert record is not None and record.status is Status.COMPLETED and record.result == "ok"


def test_an_unreachable_redis_fails_closed_without_the_password() -> None:
    port = free_port()  # nothing listens there

    async def main() -> None:
        async with aio.open_store(f"redis://:hunter2@127.0.0.1:{port}/0") as store:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as unavailable:
                await aio.run(store, "k-1", lambda ctx: "never")
            assert time.monotonic() - started < 30  # refused at once, not retried for long
            assert "hunter2" not in str(unavailable.value)
            assert f"127.0.0.1:{port}" in str(unavailable.value)

    asyncio.run(main())


def test_redis_scripts_flushed_from_the_server_are_loaded_again(redis_server: RedisServer) -> None:
    """After SCRIPT FLUSH (a restart, a failover) both ways of sending, one command and a
    pipeline of them (over 500 keys), load the scripts and go on."""
    from idemctl.model import ClaimRequest

    async def main() -> tuple[Any, list[Any]]:
        async with aio.open_store(redis_url(redis_server)) as store:
            assert isinstance(store, AsyncRedisStore)
            await store._client.script_flush()
            one = await store.claim("flushed-1")
            await store._client.script_flush()
            many = await store.claim_many([ClaimRequest(f"flushed-{i}") for i in range(2, 702)])
            return one, many

    one, many = asyncio.run(main())
    assert isinstance(one, Acquired)
    assert len(many) == 700 and all(isinstance(a, Acquired) for a in many)
