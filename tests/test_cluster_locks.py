"""Locks, MultiLock, fencing and the decorators on a real 3-master Redis Cluster.

The core scenarios of tests/test_locks.py, run with ``REDIS_PATTERNS["CONNECTION"]`` set to
a ``redis+cluster://`` URL: acquire/release/extend (sync and async), mutual exclusion
across threads, strictly rising fencing tokens, MultiLock all-or-nothing and deadlock
freedom, odd names (braces, unicode), and a live slot migration of the lock namespace.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from redis.crc import key_slot

from django_redispatterns import connection
from django_redispatterns.locks import (
    Lock,
    MultiLock,
    _names,
    _waiting,
    fence_key,
    held_key,
    locked,
    single_flight,
)
from tests import test_locks
from tests.redis_servers import KEY_PREFIX
from tests.topologies import ClusterTopology


def test_lock_acquire_extend_release_on_cluster(cluster_settings: str) -> None:
    client = connection.get_client("LOCKS")
    lock = Lock("report", ttl=5, auto_renew=False)
    assert lock.acquire()
    assert client.get(held_key("report")).startswith(lock.token.encode())  # type: ignore[union-attr]
    assert not Lock("report", ttl=5).acquire()
    lock.extend(20)
    assert client.pttl(held_key("report")) > 10_000
    first = lock.fencing_token
    lock.release()
    assert client.get(held_key("report")) is None
    with Lock("report", ttl=5) as again:
        assert again.fencing_token > first  # type: ignore[operator]
    assert client.pttl(fence_key("report")) > 0


def test_async_lock_on_cluster(cluster_settings: str) -> None:
    async def main() -> tuple[bool, bool]:
        try:
            async with Lock("areport", ttl=5) as lock:
                taken = await Lock("areport", ttl=5).aacquire()
                owned = lock.owned()
            return taken, owned
        finally:
            await connection.get_async_client("LOCKS").aclose()

    assert asyncio.run(main()) == (False, True)
    assert connection.get_client("LOCKS").get(held_key("areport")) is None


def test_mutual_exclusion_and_rising_fences_across_threads_on_cluster(
    cluster_settings: str,
) -> None:
    client = connection.get_client("LOCKS")
    counter = f"{KEY_PREFIX}:locktest:{{ctr}}:counter"
    client.set(counter, 0, ex=120)
    inside: list[int] = []
    fences: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(40):
                with Lock("counter", ttl=10, wait=60) as lock:
                    inside.append(1)
                    assert len(inside) == 1, "two holders at once"
                    fences.append(lock.fencing_token)  # type: ignore[arg-type]
                    client.set(counter, int(client.get(counter)) + 1, ex=120)  # type: ignore[arg-type]
                    inside.pop()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert int(client.get(counter)) == 160  # type: ignore[arg-type]
    assert fences == sorted(fences) and len(set(fences)) == 160


def test_multilock_all_or_nothing_and_odd_names_on_cluster(cluster_settings: str) -> None:
    client = connection.get_client("LOCKS")
    names = ["a", "{evil}", "}", "ünïcode", "x" * 500]
    b = Lock("}", ttl=10)
    assert b.acquire()
    multi = MultiLock(names, ttl=10)
    assert not multi.acquire()  # one name held elsewhere: nothing taken
    assert not any(client.exists(held_key(n)) for n in names if n != "}")
    b.release()
    with multi:
        assert multi.owned()
        assert set(multi.fencing_tokens) == set(names)
        assert not Lock("{evil}", ttl=1).acquire()
    assert not any(client.exists(held_key(n)) for n in names)


def test_multilock_opposite_orders_never_deadlock_on_cluster(cluster_settings: str) -> None:
    # the very scenario of the single-node suite, on the cluster
    test_locks.test_multilock_opposite_orders_never_deadlock_or_overlap()


def test_locked_and_single_flight_on_cluster(cluster_settings: str) -> None:
    runs: list[int] = []

    @single_flight(name="nightly", ttl=10)
    def job() -> str:
        runs.append(1)
        assert Lock("nightly", ttl=1).acquire() is False
        return "done"

    @locked(name="exclusive", ttl=10)
    def exclusive() -> int:
        return 42

    assert job() == "done" and runs == [1]
    assert exclusive() == 42


def test_lock_namespace_survives_a_live_slot_migration(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    """A migration of the namespace's slot while locks are held and taken: single-key
    calls follow ASK, multi-key acquire/release scripts are retried on TRYAGAIN (they never
    ran), nothing is double-granted and no held lock is lost."""
    client = connection.get_client("LOCKS")
    held = Lock("held-during-move", ttl=30, auto_renew=False)
    assert held.acquire()
    slot = client.keyslot(held_key("x"))
    owner = redis_cluster.master_for_slot(slot)
    target = next(m for m in redis_cluster.masters() if m.port != owner.port)
    source = redis_cluster.migrate_slot_start(slot, target)
    # Move half of the namespace's keys now: the slot is split between two nodes.
    moved = [held_key("held-during-move")]
    redis_cluster.migrate_keys(source, target, moved)
    finisher = threading.Timer(0.5, redis_cluster.migrate_slot_finish, (slot, source, target))
    finisher.start()
    try:
        started = time.monotonic()
        # the lock whose key moved is still held by its owner (ASK followed on the target)
        assert not Lock("held-during-move", ttl=5).acquire()
        assert held.owned()
        # a new lock whose keys are split / not yet moved: acquire is retried, then succeeds
        with Lock("taken-during-move", ttl=5) as other:
            assert other.owned()
        waited = time.monotonic() - started
        assert 0.3 < waited < 10  # rejected (TRYAGAIN) until the migration finished
    finally:
        finisher.join()
    assert redis_cluster.master_for_slot(slot).port == target.port
    held.release()
    assert client.get(held_key("held-during-move")) is None
    with Lock("held-during-move", ttl=5) as again:
        assert again.fencing_token > held.fencing_token  # type: ignore[operator]


@pytest.mark.parametrize("name", ["", None])
def test_bad_lock_names_still_fail_before_touching_the_cluster(
    cluster_settings: str, name: object
) -> None:
    with pytest.raises(ValueError, match="lock name"):
        Lock(name)  # type: ignore[arg-type]


def test_a_waiter_is_woken_by_the_release_on_cluster(
    cluster_settings: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wake-up list and the waiting marker share the lock's slot; the waiter blocks on
    the slot's node over a connection of its own, and a release wakes it."""
    for bound in ("MAX_BLOCK", "MIN_DELAY", "MAX_DELAY"):
        monkeypatch.setattr(_waiting, bound, 60.0)  # only a wake-up ends the wait early
    client = connection.get_client("LOCKS")
    names = [held_key("cwake"), fence_key("cwake"), _names.waiting_key("cwake"),
             _names.wake_key("cwake")]
    assert len({key_slot(k.encode()) for k in names}) == 1
    holder = Lock("cwake", ttl=30, auto_renew=False)
    assert holder.acquire()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(
        Lock("cwake", ttl=5, wait=90, auto_renew=False).acquire()))
    waiter.start()
    deadline = time.monotonic() + 15
    while not client.exists(_names.waiting_key("cwake")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    holder.release()
    waiter.join(15)
    assert got == [True]
    for key in names[1:]:
        assert client.pttl(key) > 0 or not client.exists(key), key
