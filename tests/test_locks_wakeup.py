"""Waiters are woken by the release, in any process: the release script pushes onto the
name's wake-up list, waiters block on it (BLPOP) on a connection of their own.

Each test gives the waiter a blocking bound far longer than the test's generous limit
(``MAX_BLOCK`` = 60 s), so a waiter that gets the lock in time was woken, not timed out.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from typing import Any

import pytest
import redis

from django_redispatterns import connection
from django_redispatterns.locks import Lock, MultiLock, _lease, _names, _waiting, held_key
from tests import lock_workers
from tests.redis_servers import KEY_PREFIX
from tests.test_locks import wait_until

LONG_BLOCK = 60.0
IN_TIME = 15.0  # generous on a loaded machine, far below LONG_BLOCK


@pytest.fixture
def long_block(monkeypatch: pytest.MonkeyPatch) -> None:
    for bound in ("MAX_BLOCK", "MIN_DELAY", "MAX_DELAY"):
        monkeypatch.setattr(_waiting, bound, LONG_BLOCK)


def _waiter(name: str, results: list[float], **kwargs: Any) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        lock = Lock(name, ttl=10, wait=90, auto_renew=False, **kwargs)
        assert lock.acquire()
        results.append(time.monotonic() - started)
        lock.release()
    return threading.Thread(target=run)


def test_a_waiter_in_another_process_is_woken_by_the_release(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    os.environ["REDIS_URL"] = redis_url
    holder = Lock("wakeup", ttl=30, auto_renew=False)
    assert holder.acquire()
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=lock_workers.woken_waiter, args=(redis_url, child_end))
    child.start()
    try:
        assert parent_end.poll(60) and parent_end.recv() == "waiting"
        # The child's first attempt failed; give it time to block on the wake-up list.
        assert wait_until(lambda: redis_client.exists(_names.waiting_key("wakeup")) == 1, IN_TIME)
        time.sleep(0.3)
        holder.release()
        assert parent_end.poll(IN_TIME), "the waiter was not woken by the release"
        assert parent_end.recv() < LONG_BLOCK
    finally:
        child.join(60)
    assert child.exitcode == 0


def test_a_release_just_before_the_waiter_blocks_is_not_lost(
    long_block: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release lands between the waiter's failed attempt and its BLPOP."""
    holder = Lock("race", ttl=30, auto_renew=False)
    assert holder.acquire()
    original = _waiting.Waiter.sleep

    def release_first(self: _waiting.Waiter, attempt: Any) -> bool:
        if holder.token is not None:
            holder.release()  # the wake-up is pushed before we block
        return original(self, attempt)

    monkeypatch.setattr(_waiting.Waiter, "sleep", release_first)
    started = time.monotonic()
    assert Lock("race", ttl=10, wait=90, auto_renew=False).acquire()
    assert time.monotonic() - started < IN_TIME


def test_each_release_wakes_one_of_several_waiters(long_block: None) -> None:
    holder = Lock("queue", ttl=30, auto_renew=False)
    assert holder.acquire()
    waited: list[float] = []
    threads = [_waiter("queue", waited) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # all four block
    holder.release()
    for t in threads:
        t.join(IN_TIME * 2)
    assert len(waited) == 4 and not any(t.is_alive() for t in threads)


def test_a_lease_that_ends_without_release_bounds_the_wait(redis_client: redis.Redis) -> None:
    """No release, no wake-up: the waiter still tries again when the holder's lease ends."""
    crashed = Lock("crashed", ttl=0.5, auto_renew=False)
    assert crashed.acquire()  # never released: like a holder that died
    assert Lock("crashed", ttl=5, wait=30, auto_renew=False).acquire()


def test_multilock_waiter_is_woken_by_the_conflicting_names_release(long_block: None) -> None:
    holder = Lock("m-b", ttl=30, auto_renew=False)
    assert holder.acquire()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(
        MultiLock(["m-a", "m-b"], ttl=5, wait=90, auto_renew=False).acquire()))
    t.start()
    time.sleep(0.5)
    holder.release()
    t.join(IN_TIME)
    assert got == [True]


def _blocked(client: redis.Redis) -> int:
    """Clients blocked (in BLPOP) on this server right now."""
    return sum(1 for c in client.client_list() if "b" in c.get("flags", ""))


def test_a_multilock_waiter_passes_on_a_wake_up_it_cannot_use(
    redis_client: redis.Redis, long_block: None,
) -> None:
    """The MultiLock waiter blocked first on "p-a" takes the wake-up of its release, then
    fails on "p-b" (still held). "p-a" is free, so that wake-up is pushed again for the
    waiter of "p-a" alone, who would otherwise stay blocked (LONG_BLOCK) on a free lock."""
    base = _blocked(redis_client)
    holder_a = Lock("p-a", ttl=30, auto_renew=False)
    holder_b = Lock("p-b", ttl=30, auto_renew=False)
    assert holder_a.acquire() and holder_b.acquire()
    multi: list[bool] = []
    m = threading.Thread(target=lambda: multi.append(
        MultiLock(["p-a", "p-b"], ttl=5, wait=90, auto_renew=False).acquire()))
    m.start()
    assert wait_until(lambda: _blocked(redis_client) == base + 1, IN_TIME)  # on p-a's list
    single: list[float] = []
    s = _waiter("p-a", single)
    s.start()
    assert wait_until(lambda: _blocked(redis_client) == base + 2, IN_TIME)  # behind it
    holder_a.release()  # wakes the MultiLock waiter (first in line), which fails on p-b
    s.join(IN_TIME)
    assert single, "the waiter of p-a alone was not woken although p-a was free"
    holder_b.release()
    m.join(IN_TIME)
    assert multi == [True]


def test_a_woken_waiter_is_not_overtaken_by_a_newcomer(
    redis_client: redis.Redis, long_block: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release hands the lock to the waiter it woke: a waiting newcomer (or the
    releaser itself coming back) that tries between the wake-up and the woken waiter's
    attempt finds the lock taken and queues behind it; the woken waiter goes first."""
    monkeypatch.setattr(_lease, "HANDOFF_MS", 120_000)  # far longer than the test
    base = _blocked(redis_client)
    holder = Lock("handoff", ttl=30, auto_renew=False)
    assert holder.acquire()
    woken, go = threading.Event(), threading.Event()
    original = _waiting.Waiter.sleep
    order: list[str] = []

    def held_back(self: _waiting.Waiter, attempt: Any) -> bool:
        slept = original(self, attempt)
        if self.woken and not go.is_set():  # the first wake-up: hold the attempt back
            woken.set()
            go.wait(IN_TIME * 4)
        return slept

    def waiter(label: str) -> threading.Thread:
        def run() -> None:
            lock = Lock("handoff", ttl=10, wait=90, auto_renew=False)
            assert lock.acquire()
            order.append(label)
            lock.release()
        return threading.Thread(target=run)

    monkeypatch.setattr(_waiting.Waiter, "sleep", held_back)
    first = waiter("woken")
    first.start()
    assert wait_until(lambda: _blocked(redis_client) == base + 1, IN_TIME)
    holder.release()
    assert woken.wait(IN_TIME)
    newcomer = waiter("newcomer")
    newcomer.start()  # tries while the woken waiter is held back, then blocks
    assert wait_until(lambda: _blocked(redis_client) == base + 1, IN_TIME)
    go.set()
    first.join(IN_TIME)
    newcomer.join(IN_TIME)
    assert order == ["woken", "newcomer"], "a newcomer overtook the waiter the release woke"


def test_a_caller_that_does_not_wait_is_not_refused_a_hand_over(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter that gave up leaves its marker, so the release hands over to nobody; a
    caller that does not wait (it never queued) still gets the lock at once."""
    monkeypatch.setattr(_lease, "HANDOFF_MS", 120_000)
    holder = Lock("gave-up", ttl=30, auto_renew=False)
    assert holder.acquire()
    assert not Lock("gave-up", ttl=5, auto_renew=False).acquire(wait=0.05)  # marks, gives up
    holder.release()
    assert redis_client.get(held_key("gave-up")) == b"~"
    assert Lock("gave-up", ttl=5, auto_renew=False).acquire(wait=0)


def test_async_waiter_is_woken_by_the_release(long_block: None) -> None:
    async def scenario() -> float:
        holder = Lock("awake", ttl=30, auto_renew=False)
        assert await holder.aacquire()

        async def wait() -> float:
            started = time.monotonic()
            lock = Lock("awake", ttl=10, wait=90, auto_renew=False)
            assert await lock.aacquire()
            await lock.arelease()
            return time.monotonic() - started

        waiter = asyncio.ensure_future(wait())
        await asyncio.sleep(0.5)
        await holder.arelease()
        return await asyncio.wait_for(waiter, IN_TIME)

    assert asyncio.run(scenario()) < IN_TIME


def test_waiters_block_on_a_connection_of_their_own(redis_client: redis.Redis) -> None:
    client = connection.get_client("LOCKS")
    key = _names.wake_key("own")
    blocking = _waiting._blocking_client(client, key)
    assert blocking.connection_pool is not client.connection_pool
    assert _waiting._blocking_client(client, key) is blocking  # one per pool, reused


def test_every_wake_up_key_has_a_ttl(redis_client: redis.Redis, long_block: None) -> None:
    holder = Lock("ttl-check", ttl=30, auto_renew=False)
    assert holder.acquire()
    waited: list[float] = []
    threads = [_waiter("ttl-check", waited) for _ in range(3)]
    for t in threads:
        t.start()
    assert wait_until(lambda: redis_client.exists(_names.waiting_key("ttl-check")) == 1, IN_TIME)
    time.sleep(0.3)
    holder.release()
    for t in threads:
        t.join(IN_TIME * 2)
    assert len(waited) == 3
    # A last release with the marker still there leaves a one-element list behind.
    keys = list(redis_client.scan_iter(match=f"{KEY_PREFIX}:lock:*ttl-check*", count=1000))
    names = {k.decode().split(":")[-2] for k in keys}
    assert "waiting" in names and "fence" in names
    for key in keys:
        assert redis_client.pttl(key) > 0, key
    assert redis_client.llen(_names.wake_key("ttl-check")) <= 1
    # Free, or handed over to a waiter ("~", with the TTL checked above) by the last release.
    assert redis_client.get(held_key("ttl-check")) in (None, b"~")


def test_an_uncontended_lock_writes_no_wake_up_keys(redis_client: redis.Redis) -> None:
    with Lock("quiet", ttl=5):
        pass
    with Lock("quiet", ttl=5, wait=5):
        pass
    assert not redis_client.exists(_names.waiting_key("quiet"), _names.wake_key("quiet"))
