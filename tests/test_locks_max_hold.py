"""``max_hold``: a ceiling on a lock's whole hold, heartbeat renewals included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redispatterns import signals
from django_redispatterns.exceptions import LockLost, LockNotOwned
from django_redispatterns.locks import Lock, held_key, locked

TTL, MAX_HOLD = 0.6, 1.5


@pytest.fixture
def lost_signals() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def handler(sender: Any, **kwargs: Any) -> None:
        got.append(kwargs)

    signals.lock_lost.connect(handler, weak=False)
    yield got
    signals.lock_lost.disconnect(handler)


def watch_hold(client: redis.Redis, lock: Lock, name: str, started: float) -> float:
    """Poll until the holder is told; return the latest moment the key was due to expire."""
    latest = 0.0
    deadline = started + MAX_HOLD + 15  # generous: the machine is shared and slow
    while not lock.lost and time.monotonic() < deadline:
        pttl = client.pttl(held_key(name))
        if pttl > 0:
            latest = max(latest, time.monotonic() - started + pttl / 1000)
        time.sleep(0.05)
    return latest


def test_heartbeat_stops_at_max_hold_and_the_holder_gets_lock_lost(
    redis_client: redis.Redis, lost_signals: list[dict[str, Any]],
) -> None:
    lock = Lock("bounded", ttl=TTL, max_hold=MAX_HOLD)
    started = time.monotonic()
    with pytest.raises(LockLost, match="max_hold"), lock:
        assert not Lock("bounded", ttl=1).acquire()
        latest = watch_hold(redis_client, lock, "bounded", started)
        assert lock.lost, "the heartbeat kept renewing past max_hold"
        assert time.monotonic() - started >= MAX_HOLD - 0.05  # not before the bound
        with pytest.raises(LockLost):
            lock.check()
    assert latest <= MAX_HOLD + 1.0  # no renewal pushed the lease past the bound
    assert [s["name"] for s in lost_signals] == ["bounded"]
    assert not redis_client.exists(held_key("bounded"))
    assert Lock("bounded", ttl=1, auto_renew=False).acquire()  # free for the next holder


def test_async_heartbeat_stops_at_max_hold(redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        started = time.monotonic()
        async with Lock("abounded", ttl=TTL, max_hold=MAX_HOLD) as lock:
            while not lock.lost and time.monotonic() < started + MAX_HOLD + 15:
                pttl = redis_client.pttl(held_key("abounded"))
                assert pttl <= 0 or time.monotonic() - started + pttl / 1000 <= MAX_HOLD + 1
                await asyncio.sleep(0.05)
            assert lock.lost and time.monotonic() - started >= MAX_HOLD - 0.05

    with pytest.raises(LockLost, match="max_hold"):
        asyncio.run(scenario())
    assert not redis_client.exists(held_key("abounded"))


def test_without_max_hold_the_heartbeat_keeps_the_lock(redis_client: redis.Redis) -> None:
    with Lock("unbounded", ttl=TTL) as lock:
        time.sleep(MAX_HOLD + 0.5)
        assert not lock.lost and lock.owned()


def test_extend_is_capped_by_max_hold(redis_client: redis.Redis) -> None:
    lock = Lock("capped", ttl=1, max_hold=1.5, auto_renew=False)
    assert lock.acquire()
    lock.extend(30)
    assert 0 < redis_client.pttl(held_key("capped")) <= 1500
    time.sleep(1.6)
    with pytest.raises(LockNotOwned):
        lock.extend(30)
    assert lock.lost


def test_async_extend_is_capped_by_max_hold(redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        lock = Lock("acapped", ttl=1, max_hold=1.5, auto_renew=False)
        assert await lock.aacquire()
        await lock.aextend(30)
        assert 0 < redis_client.pttl(held_key("acapped")) <= 1500
        await lock.arelease()

    asyncio.run(scenario())


def test_decorated_function_past_max_hold_raises_lock_lost() -> None:
    @locked(name="bounded-job", ttl=TTL, max_hold=MAX_HOLD)
    def job() -> None:
        time.sleep(MAX_HOLD + 1.5)

    with pytest.raises(LockLost):
        job()


@pytest.mark.parametrize(("value", "error"), [
    (0, ValueError), (-1, ValueError), (0.5, ValueError), ("60", TypeError), (True, TypeError),
])
def test_bad_max_hold_is_rejected(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_hold"):
        Lock("x", ttl=1, max_hold=value)
