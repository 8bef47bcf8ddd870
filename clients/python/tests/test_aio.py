"""The asyncio client against a real agent, configd and etcd (conftest):
the same operations as the sync client's, and what cancelling a task
must give back."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from conftest import Cluster, fixed_remaining, fixed_waiting, until
from sluice_agent import (AsyncGrant, AsyncLimiter, AsyncReservation, InvalidRequest, Limiter, NoQuota, NotAllowed,
                          NotYetValid, SluiceError, Timeout, UnknownGrant)


async def auntil(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """until, letting the event loop run between polls."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.002)  # polling the agent's state


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())  # type: ignore[arg-type]


def test_async_acquire_settle_with_a_context_manager(sock: str) -> None:
    async def main() -> None:
        async with AsyncLimiter("fixed", caller="py-async", socket=sock) as lim:
            before = fixed_remaining(sock)
            async with lim.acquire(tokens=200, max_wait=0.5) as g:
                assert isinstance(g, AsyncGrant) and g.cost == {"requests": 1, "tokens": 200}
                assert fixed_remaining(sock) == {"requests": before["requests"] - 1, "tokens": before["tokens"] - 200}
                await g.settle(tokens=50, requests=0)
            assert fixed_remaining(sock) == {"requests": before["requests"], "tokens": before["tokens"] - 50}
            with pytest.raises(UnknownGrant):
                await g.settle(tokens=1)
            g2 = await lim.acquire(tokens=10)
            await g2.cancel()
            g3 = await lim.try_acquire(tokens=20)
            assert g3 is not None
            await g3.settle(tokens=0, requests=0)
            assert fixed_remaining(sock) == {"requests": before["requests"], "tokens": before["tokens"] - 50}
    run(main)


def test_async_refusals_are_typed_and_change_nothing(sock: str) -> None:
    async def main() -> None:
        async with AsyncLimiter("fixed", socket=sock) as lim:
            g0 = await lim.acquire(tokens=1, requests=0)  # so that the rest is less than the quota
            before = fixed_remaining(sock)
            with pytest.raises(NoQuota) as e:
                await lim.acquire(tokens=1001, max_wait=0.1)  # above the quota: waits for it to grow
            assert e.value.status == 429 and "tokens" in e.value.message
            with pytest.raises(Timeout):
                await lim.acquire(tokens=before["tokens"] + 1, max_wait=0.5)  # the room comes back within the hour
            with pytest.raises(InvalidRequest):
                await lim.acquire(images=1)
            with pytest.raises(InvalidRequest):
                await lim.reserve(tokens=-5)
            with pytest.raises(TypeError):
                lim.acquire(tokens=1.5)  # type: ignore[arg-type]
            assert await lim.try_acquire(tokens=before["tokens"] + 1) is None
            with pytest.raises(NotAllowed):
                await AsyncLimiter("not-ours", socket=sock).acquire()
            assert fixed_remaining(sock) == before
            await g0.cancel()
        with pytest.raises(SluiceError) as ei:
            await AsyncLimiter("fixed", socket="/nonexistent/agent.sock").acquire()
        assert ei.value.reason == "CLOSED"
    run(main)


def test_async_reserve_then_cancel(sock: str) -> None:
    async def main() -> None:
        async with AsyncLimiter("fixed", socket=sock) as lim:
            g0 = await lim.acquire(tokens=1, requests=0)
            before = fixed_remaining(sock)
            r = await lim.reserve(tokens=before["tokens"] + 1, max_wait=3600.0)  # the next hour's window
            assert isinstance(r, AsyncReservation) and r.delay > 0
            with pytest.raises(NotYetValid):
                await r.settle(tokens=0)
            assert fixed_waiting(sock) == 1
            await r.cancel()
            assert fixed_waiting(sock) == 0 and fixed_remaining(sock) == before
            # Valid at once: async with does not wait, and settles as a grant.
            async with lim.reserve(tokens=5) as r2:
                assert r2.delay == 0
                await r2.settle(tokens=0, requests=0)
            assert fixed_remaining(sock) == before
            await g0.cancel()
    run(main)


def test_async_task_cancelled_while_the_agent_makes_it_wait(sock: str) -> None:
    """The agent holds the wait; cancelling the task ends it, and the
    permits the wait had reserved go back."""
    async def main() -> None:
        async with AsyncLimiter("fixed", caller="py-async", socket=sock) as lim:
            g0 = await lim.acquire(tokens=1, requests=0)
            before = fixed_remaining(sock)
            # One token more than is left: the agent holds the wait until the next hour.
            task = asyncio.ensure_future(lim.acquire(tokens=before["tokens"] + 1, max_wait=3600.0))
            await auntil(lambda: fixed_waiting(sock) == 1, "the agent holds the wait")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The task saw the agent end the wait before it ended: nothing to poll for.
            assert fixed_waiting(sock) == 0
            assert fixed_remaining(sock) == before
            g = await lim.try_acquire(tokens=before["tokens"], requests=0)  # all of it is there
            assert g is not None
            await g.cancel()
            await g0.cancel()
    run(main)


def test_async_task_cancelled_after_the_agent_granted(sock: str) -> None:
    """The agent granted and answered, but the task is cancelled before it
    reads the answer: the client cancels that grant."""
    async def main() -> None:
        async with AsyncLimiter("fixed", socket=sock) as lim:
            before = fixed_remaining(sock)
            await (await lim.acquire(tokens=0)).settle(requests=0)  # leaves a kept connection
            for _ in range(20):
                task = asyncio.ensure_future(lim.acquire(tokens=7, requests=0))
                await asyncio.sleep(0)  # the task writes its request on the kept connection, then waits
                # The loop is blocked here, so the task cannot read the
                # answer the agent sends.
                until(lambda: fixed_remaining(sock)["tokens"] == before["tokens"] - 7, "the agent granted")
                if task.done():  # read on this interpreter before the cancel: not the case under test
                    await (task.result()).cancel()
                    continue
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert fixed_remaining(sock) == before
                return
            pytest.fail("the task read its answer before every cancel")
    run(main)


def test_async_reservation_cancelled_before_valid(sock: str) -> None:
    """A task cancelled while it waits for its reservation to become valid
    cancels the reservation."""
    async def use(r: AsyncReservation) -> None:
        async with r:
            raise AssertionError("entered a reservation not yet valid")

    async def main() -> None:
        async with AsyncLimiter("fixed", socket=sock) as lim:
            g0 = await lim.acquire(tokens=1, requests=0)
            before = fixed_remaining(sock)
            r = await lim.reserve(tokens=before["tokens"] + 1, max_wait=3600.0)
            task = asyncio.ensure_future(use(r))
            await asyncio.sleep(0)  # the task is asleep until the next hour
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert r.done and fixed_waiting(sock) == 0 and fixed_remaining(sock) == before
            await g0.cancel()
    run(main)


def test_async_many_tasks_share_the_limit(sock: str) -> None:
    """Many tasks at once, each on a connection of its own, on a provider
    shared through configd: every one granted, each grant its own."""
    async def one(lim: AsyncLimiter, i: int) -> str:
        async with lim.acquire(tokens=3, max_wait=5.0) as g:
            await g.settle(tokens=1)
            return g.id

    async def main() -> None:
        async with AsyncLimiter("llm", caller="py-tasks", socket=sock) as lim:
            ids = await asyncio.gather(*(one(lim, i) for i in range(20)))
            assert len(set(ids)) == 20
            st = await lim.status()
            counts = next(c for c in st["callers"] if c["caller"] == "py-tasks")["counts"]
            assert counts["acquire"]["OK"] == 20 and counts["settle"]["OK"] == 20
    run(main)


def test_tcp_needs_the_token(cluster: Cluster, sock: str) -> None:
    """Over loopback TCP, both clients carry the token; without it the
    agent refuses."""
    url = cluster.urls["agent-a"]

    async def main() -> None:
        async with AsyncLimiter("fixed", url=url, token=cluster.token) as lim:
            g = await lim.acquire(tokens=1)
            await g.settle(tokens=0, requests=0)
        with pytest.raises(NotAllowed) as e:
            await AsyncLimiter("fixed", url=url).acquire(tokens=1)
        assert e.value.reason == "UNAUTHENTICATED"
    before = fixed_remaining(sock)
    run(main)
    g = Limiter("fixed", url=url, token=cluster.token).acquire(tokens=1)
    g.settle(tokens=0, requests=0)
    with pytest.raises(NotAllowed):
        Limiter("fixed", url=url, token="wrong-token-0123456789").acquire(tokens=1)
    assert fixed_remaining(sock) == before


def test_async_class_is_sent_and_checked(sock: str) -> None:
    async def main() -> None:
        before = fixed_remaining(sock)
        async with AsyncLimiter("fixed", caller="py-aclass", class_="critical", socket=sock) as lim:
            await (await lim.acquire(tokens=1, max_wait=0.5)).cancel()
            g = await lim.try_acquire(tokens=1, class_="batch")
            assert g is not None
            await g.cancel()
            await (await lim.reserve(tokens=1, max_wait=0.5, class_="nonesuch")).cancel()
            async with AsyncLimiter("fixed", class_="Critical!", socket=sock) as bad:
                for call in (lambda: bad.acquire(tokens=1, max_wait=0.5), lambda: bad.try_acquire(tokens=1),
                             lambda: bad.reserve(tokens=1, max_wait=0.5), lambda: lim.acquire(tokens=1, class_="9lives")):
                    with pytest.raises(InvalidRequest) as e:
                        await call()
                    assert e.value.reason == "BAD_REQUEST" and "class" in e.value.message
                await (await bad.acquire(tokens=1, class_="critical")).cancel()
            with pytest.raises(TypeError):
                lim.acquire(tokens=1, class_=1)  # type: ignore[arg-type]
        assert fixed_remaining(sock) == before

    run(main)
