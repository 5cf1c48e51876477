"""Locks: mutual exclusion, ownership, fencing, heartbeat, waiting, MultiLock, bad input.

Real Redis only. Fault scenarios (restart, pause, quorum) are in test_locks_faults.py and
the management-command scenarios in test_locks_commands.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from django_redispatterns import connection, scripts, signals
from django_redispatterns.exceptions import (
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisPatternsError,
)
from django_redispatterns.locks import (
    Lock,
    MultiLock,
    _heartbeat,
    current_lock,
    fence_key,
    held_key,
    locked,
    single_flight,
)
from django_redispatterns.locks._lease import parse_acquire
from tests import lock_workers
from tests.redis_servers import KEY_PREFIX


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Collect lock signals sent during the test."""
    got: dict[str, list[dict[str, Any]]] = {"acquired": [], "lost": [], "renew_failed": []}
    handlers = {}
    for name in got:
        def handler(sender: Any, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            got[_name].append(kwargs)
        handlers[name] = handler
        getattr(signals, f"lock_{name}").connect(handler, weak=False)
    yield got
    for name, handler in handlers.items():
        getattr(signals, f"lock_{name}").disconnect(handler)


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def lock_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match=f"{KEY_PREFIX}:lock:*", count=1000))


# --- happy path -------------------------------------------------------------------------


def test_acquire_release_tokens_and_key_layout(redis_client: redis.Redis) -> None:
    first = Lock("report", ttl=5)
    assert first.acquire()
    assert first.token and len(first.token) >= 33
    key = held_key("report")
    assert key == f"{KEY_PREFIX}:lock:{{locks}}:held:report"
    assert redis_client.get(key).startswith(first.token.encode() + b"|")  # type: ignore[union-attr]
    assert 0 < redis_client.pttl(key) <= 5000
    assert first.owned()
    first_token, first_fence = first.token, first.fencing_token
    first.release()
    assert not redis_client.exists(key)
    assert not first.owned() and first.token is None

    second = Lock("report", ttl=5)
    with second:
        assert second.token != first_token
        assert first_fence is not None and second.fencing_token is not None
        assert second.fencing_token > first_fence
    assert not redis_client.exists(key)


def test_acquire_and_release_are_one_round_trip_each(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = connection.client_for(redis_url)
    lock = Lock("one-trip", ttl=5, auto_renew=False, connection=redis_url)
    assert lock.acquire()  # warm: loads the script (NOSCRIPT -> EVAL) once
    lock.release()
    sent: list[Any] = []
    original = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(client, "execute_command", counting)
    assert lock.acquire()
    assert sent == ["EVALSHA"]
    lock.release()
    assert sent == ["EVALSHA", "EVALSHA"]


@pytest.mark.parametrize("script", ["lock_acquire", "lock_acquire_one"])
def test_acquire_retry_with_same_token_succeeds_with_same_fence(
    redis_client: redis.Redis, script: str,
) -> None:
    """A re-sent acquire finds our token in the key and reports success again, with the
    same fencing token; another owner is told the holder's remaining lease. Both scripts:
    MultiLock's (any number of names) and Lock's (one name, integer replies)."""
    lock = Lock(f"d4-{script}", ttl=5, auto_renew=False)
    token = "ab" * 16
    keys_, args = lock._acquire_call(token)
    acquire = scripts.script(script)
    first = parse_acquire(acquire(redis_client, keys_, args))
    again = parse_acquire(acquire(redis_client, keys_, args))
    assert first.ok and again.ok
    assert first.fences == again.fences  # no second fencing token for the same acquisition
    assert int(redis_client.get(keys_[1])) == first.fences[0]  # type: ignore[arg-type]
    other = parse_acquire(acquire(redis_client, keys_, ["cd" * 16, *args[1:]]))
    assert not other.ok and other.conflict == 1 and 0 < other.holder_pttl <= 5000
    release = scripts.script(script.replace("acquire", "release"))
    assert release(redis_client, keys_[:1], ["cd" * 16]) == 0  # not the holder: left alone
    assert release(redis_client, keys_[:1], [token]) == 1
    assert redis_client.exists(keys_[0]) == 0


def test_one_name_fence_text_matches_the_fence_at_every_clock_value(
    redis_client: redis.Redis,
) -> None:
    """The stored fence (held value and counter) is the returned one, also when the
    server clock's microseconds have leading zeros (the script pads them itself)."""
    acquire = scripts.script("lock_acquire_one")
    release = scripts.script("lock_release_one")
    lock = Lock("fence-text", ttl=5, auto_renew=False)
    padded = 0
    last = 0
    for i in range(20_000):
        token = f"{i:032x}"
        keys_, args = lock._acquire_call(token)
        fence = acquire(redis_client, keys_, args)
        stored = redis_client.get(keys_[0]).split(b"|")  # type: ignore[union-attr]
        assert stored[0] == token.encode() and int(stored[1]) == fence
        assert stored[1] == str(fence).encode()
        assert int(redis_client.get(keys_[1])) == fence  # type: ignore[arg-type]
        assert fence > last
        last = fence
        assert release(redis_client, keys_[:1], [token]) == 1
        padded += fence % 1_000_000 < 100_000
        if padded >= 3:
            break
    assert padded >= 3, "never saw a clock value with leading zeros in its microseconds"


def test_acquire_signal_and_context_manager_value(received: dict[str, list[Any]]) -> None:
    with Lock("signalled", ttl=5) as lock:
        assert received["acquired"] == [
            {"name": "signalled", "token": lock.token, "fencing_token": lock.fencing_token}
        ]


# --- mutual exclusion -------------------------------------------------------------------


def test_mutual_exclusion_8_threads_x_100_increments(redis_client: redis.Redis) -> None:
    counter = f"{KEY_PREFIX}:locktest:counter"
    redis_client.set(counter, 0, ex=120)
    inside = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(100):
                with Lock("counter", ttl=10, wait=60):
                    inside.append(1)
                    assert len(inside) == 1, "two holders at once"
                    value = int(redis_client.get(counter))  # type: ignore[arg-type]
                    redis_client.set(counter, value + 1, ex=120)  # read-modify-write
                    inside.pop()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert int(redis_client.get(counter)) == 800  # type: ignore[arg-type]


def test_fencing_tokens_strictly_increase_across_4_processes(
    redis_client: redis.Redis, redis_url: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    os.environ["REDIS_URL"] = redis_url
    start = ctx.Event()
    procs = [ctx.Process(target=lock_workers.fence_worker, args=(redis_url, start, 25))
             for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    log = [int(x) for x in redis_client.lrange(lock_workers.FENCE_LOG, 0, -1)]
    assert len(log) == 100
    assert all(a < b for a, b in itertools.pairwise(log)), "fencing went backwards"


def test_fencing_keeps_rising_after_the_counter_is_lost(redis_client: redis.Redis) -> None:
    """Counter expired (or a failover lost it): fencing tokens still rise (server time)."""
    with Lock("fence-loss", ttl=5) as first:
        pass
    redis_client.delete(fence_key("fence-loss"))
    with Lock("fence-loss", ttl=5) as second:
        assert second.fencing_token > first.fencing_token  # type: ignore[operator]
    # A counter ahead of the clock (e.g. written by a master whose clock ran fast) still wins.
    redis_client.set(fence_key("fence-loss"), 5 * 10**15, px=60_000)
    with Lock("fence-loss", ttl=5) as third:
        assert third.fencing_token == 5 * 10**15 + 1


# --- ownership (anchor bugs: plain DEL release, pottery's extend cap) --------------------


def test_paused_holder_cannot_release_or_extend_the_new_owners_lock(
    redis_client: redis.Redis,
) -> None:
    a = Lock("paused", ttl=0.3, auto_renew=False)
    assert a.acquire()
    time.sleep(0.5)  # "GC pause" past the lease
    b = Lock("paused", ttl=10, auto_renew=False)
    assert b.acquire()
    with pytest.raises(LockNotOwned):
        a.extend(10)
    with pytest.raises(LockNotOwned):
        a.release()
    assert b.owned()
    assert redis_client.pttl(held_key("paused")) > 9000  # A's extend did not touch it
    assert b.fencing_token > a.fencing_token  # type: ignore[operator]
    b.release()


def test_anchor_celery_once_plain_del_release_never_deletes_another_owners_lock(
    redis_client: redis.Redis,
) -> None:
    """celery-once / django-cron release with a plain DEL; ours compares the token first."""
    a = Lock("cron-job", ttl=0.2, auto_renew=False)
    a.acquire()
    time.sleep(0.3)
    b = Lock("cron-job", ttl=5, auto_renew=False)
    b.acquire()
    with pytest.raises(LockLost):  # leaving A's block: the lease had ended
        a._exit(None)
    value = redis_client.get(held_key("cron-job"))
    assert value is not None and value.startswith(b.token.encode())  # type: ignore[union-attr]
    b.release()


def test_anchor_pottery_extend_is_not_capped(redis_client: redis.Redis) -> None:
    """pottery's Redlock refuses a 4th extend(); a lease may be renewed without limit."""
    with Lock("long-job", ttl=1, auto_renew=False) as lock:
        for _ in range(10):
            lock.extend(2)
        assert 1000 < redis_client.pttl(held_key("long-job")) <= 2000


def test_anchor_redis_py_lock_has_no_ttl_by_default(redis_client: redis.Redis) -> None:
    """redis-py's Lock(timeout=None) never expires; ours always has a lease (LOCKS TTL)."""
    with Lock("defaults"):
        pttl = redis_client.pttl(held_key("defaults"))
        assert 25_000 < pttl <= 30_000
    for bad in (0, -1, None.__class__):
        with pytest.raises((ValueError, TypeError)):
            Lock("defaults", ttl=bad)  # type: ignore[arg-type]


def test_release_or_extend_without_acquire(redis_client: redis.Redis) -> None:
    lock = Lock("never", ttl=5)
    with pytest.raises(LockNotOwned, match="never"):
        lock.release()
    with pytest.raises(LockNotOwned):
        lock.extend()
    assert not lock.owned()


def test_instance_is_not_reentrant() -> None:
    with Lock("reentry", ttl=5) as lock, pytest.raises(RuntimeError, match="not reentrant"):
        lock.acquire()


# --- heartbeat --------------------------------------------------------------------------


def test_heartbeat_keeps_a_2s_lock_through_a_5s_body(redis_client: redis.Redis) -> None:
    with Lock("beat", ttl=2) as lock:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert not Lock("beat", ttl=2, auto_renew=False).acquire()
            time.sleep(0.25)
        assert lock.owned() and not lock.lost
        renewal = lock._renewal
        assert renewal is not None and renewal.running
    assert renewal is not None and not renewal.running  # stopped before release returned
    time.sleep(0.5)
    assert not redis_client.exists(held_key("beat"))  # no late renewal recreated it


def test_heartbeat_threads_do_not_outlive_their_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_heartbeat, "IDLE_SECONDS", 0.2)
    wait_until(lambda: _heartbeat.live_workers() == 0, 5)  # threads from earlier tests
    locks = [Lock(f"pool-{i}", ttl=1) for i in range(3)]
    for lock in locks:
        assert lock.acquire()
    time.sleep(0.5)  # a few renewals each
    assert _heartbeat.live_workers() >= 1
    assert all(lock.owned() for lock in locks)
    for lock in locks:
        lock.release()
    assert wait_until(lambda: _heartbeat.live_workers() == 0, 5)


def test_released_lock_is_never_renewed_again(redis_client: redis.Redis) -> None:
    """Release waits for a renewal in flight; nothing extends the key afterwards."""
    renewals = []
    # A TTL long enough that a loaded machine cannot lose the lease between renewals
    # (renewals run every third of it).
    lock = Lock("renewed", ttl=1.5)
    original = lock._renew

    def slow_renew() -> bool:
        renewals.append(time.monotonic())
        time.sleep(0.2)  # a renewal in flight while release() runs
        return original()

    lock._renew = slow_renew  # type: ignore[method-assign]
    assert lock.acquire()
    assert wait_until(lambda: len(renewals) >= 1, 10)
    lock.release()
    released_at = time.monotonic()
    count = len(renewals)
    time.sleep(1.5)  # past the next renewals' times
    assert count >= 1 and len(renewals) == count
    assert all(t < released_at for t in renewals)


@pytest.mark.parametrize("steal", ["overwrite", "delete"])
def test_stolen_lease_raises_lock_lost_when_leaving_the_block(
    redis_client: redis.Redis, received: dict[str, list[Any]], caplog: Any, steal: str
) -> None:
    """Anchor: python-redis-lock's renewal thread dies silently when the key is lost."""
    key = held_key("stolen")
    caplog.set_level(logging.ERROR, logger="django_redispatterns.locks")
    with pytest.raises(LockLost, match="stolen"), Lock("stolen", ttl=0.6) as lock:
        if steal == "overwrite":
            redis_client.set(key, b"someone-else|1|{}", px=5000)
        else:
            redis_client.delete(key)
            assert Lock("stolen", ttl=5, auto_renew=False).acquire()  # a second client
        assert wait_until(lambda: lock.lost, 3)
        with pytest.raises(LockLost):
            lock.check()  # the checkpoint API for long bodies
    value = redis_client.get(key)  # the other owner's lock is untouched
    assert value is not None
    assert value == b"someone-else|1|{}" if steal == "overwrite" else value.count(b"|") >= 2
    assert [e["name"] for e in received["lost"]] == ["stolen"]
    assert "lost while held" in caplog.text


def test_body_exception_is_not_masked_by_lost_lease(redis_client: redis.Redis) -> None:
    with pytest.raises(ZeroDivisionError), Lock("masked", ttl=5, auto_renew=False):
        redis_client.delete(held_key("masked"))
        1 / 0  # noqa: B018


# --- waiting ----------------------------------------------------------------------------


def test_wait_gives_up_after_the_wait_without_spinning(redis_server_factory: Any) -> None:
    server = redis_server_factory()
    holder = Lock("busy", ttl=30, connection=server.url)
    assert holder.acquire()
    client = server.client()
    client.config_resetstat()
    started = time.monotonic()
    waiter = Lock("busy", ttl=5, wait=1.0, connection=server.url)
    with pytest.raises(LockNotAcquired, match="busy"):
        waiter.__enter__()
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 10.0  # gave up near its wait (upper bound: a loaded machine)
    calls = client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls <= 20, f"{calls} attempts in 1 s: busy-spinning"
    holder.release()


def test_wait_acquires_soon_after_release() -> None:
    holder = Lock("handover", ttl=30)
    holder.acquire()
    timer = threading.Timer(0.5, holder.release)
    timer.start()
    started = time.monotonic()
    taker = Lock("handover", ttl=5, wait=10)
    assert taker.acquire()
    try:
        assert 0.4 <= time.monotonic() - started < 9.0  # well before its 10 s wait
    finally:
        timer.join()
        taker.release()  # a held lock's heartbeat would report it lost in a later test


def test_wait_zero_fails_at_once() -> None:
    with Lock("instant", ttl=5):
        started = time.monotonic()
        assert not Lock("instant", ttl=5).acquire()
        assert time.monotonic() - started < 5  # no waiting, no retry schedule


# --- MultiLock --------------------------------------------------------------------------


def test_multilock_partial_conflict_holds_nothing(redis_client: redis.Redis) -> None:
    b = Lock("b", ttl=10)
    b.acquire()
    multi = MultiLock(["a", "b", "c"], ttl=10)
    assert not multi.acquire()
    assert not redis_client.exists(held_key("a")) and not redis_client.exists(held_key("c"))
    b.release()
    with multi:
        values = {redis_client.get(held_key(n)).split(b"|")[0] for n in "abc"}  # type: ignore[union-attr]
        assert values == {multi.token.encode()}  # type: ignore[union-attr]
        assert set(multi.fencing_tokens) == {"a", "b", "c"}
        assert not Lock("c", ttl=1).acquire()
    assert not any(redis_client.exists(held_key(n)) for n in "abc")


def test_multilock_opposite_orders_never_deadlock_or_overlap() -> None:
    holders: list[str] = []
    overlap: list[bool] = []

    def run(names: list[str], who: str) -> None:
        for _ in range(150):
            with MultiLock(names, ttl=5, wait=30):
                holders.append(who)
                overlap.append(len(holders) > 1)
                holders.remove(who)

    threads = [threading.Thread(target=run, args=(["x", "y"], "p1")),
               threading.Thread(target=run, args=(["y", "x"], "p2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "deadlock"
    assert len(overlap) == 300 and not any(overlap)


def test_every_key_of_a_namespace_shares_one_cluster_slot() -> None:
    names = ["a", "nightly report", "{evil}", "}", "ünïcode", "x" * 10_000]
    slots = {key_slot(k.encode()) for n in names for k in (held_key(n), fence_key(n))}
    assert len(slots) == 1
    assert all(len(held_key(n)) < 100 for n in names)  # bounded key names
    assert held_key("{evil}").endswith(held_key("{evil}").rsplit(":", 1)[1])
    assert "{evil}" not in held_key("{evil}")


def test_odd_names_lock_and_release(redis_client: redis.Redis) -> None:
    with MultiLock(["nightly report", "{evil}", "ünïcode", "x" * 10_000], ttl=5) as multi:
        assert multi.owned()
        assert not Lock("{evil}", ttl=5).acquire()
    assert lock_keys(redis_client) == [k for k in lock_keys(redis_client) if b":fence:" in k]


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"name": ""}, ValueError, "name"),
        ({"name": 42}, ValueError, "name"),
        ({"name": "n", "ttl": 0}, ValueError, "ttl"),
        ({"name": "n", "ttl": -3}, ValueError, "ttl"),
        ({"name": "n", "ttl": True}, TypeError, "ttl"),
        ({"name": "n", "ttl": "30"}, TypeError, "ttl"),
        ({"name": "n", "wait": -1}, ValueError, "wait"),
        ({"name": "n", "namespace": "a{b}"}, ValueError, "namespace"),
        ({"name": "n", "namespace": ""}, ValueError, "namespace"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs: dict[str, Any], error: type, named: str) -> None:
    with pytest.raises(error, match=named):
        Lock(**kwargs)


def test_multilock_bad_input() -> None:
    with pytest.raises(TypeError, match="list of names"):
        MultiLock("abc")
    with pytest.raises(ValueError, match="at least one"):
        MultiLock([])


# --- decorators on plain functions -------------------------------------------------------


def test_locked_function_raises_lock_not_acquired_and_exposes_the_fence() -> None:
    @locked(name=lambda user_id: f"export-{user_id}", ttl=5)
    def export(user_id: int) -> int | None:
        lock = current_lock()
        assert lock is not None and lock.name == f"export-{user_id}"
        return lock.fencing_token

    assert isinstance(export(7), int)
    assert current_lock() is None
    with Lock("export-7", ttl=5):
        with pytest.raises(LockNotAcquired, match="export-7") as info:
            export(7)
        assert isinstance(info.value, RedisPatternsError)
        assert isinstance(export(8), int)  # another name is free


def test_single_flight_function_skips_with_one_stderr_line(capsys: Any) -> None:
    calls = []

    @single_flight(ttl=5)
    def rebuild() -> str:
        calls.append(1)
        return "done"

    name = f"{rebuild.__module__}.{rebuild.__qualname__}"
    with Lock(name, ttl=5):
        assert rebuild() is None
    assert capsys.readouterr().err.count("\n") == 1
    assert rebuild() == "done"
    assert calls == [1]


def test_callable_name_must_return_a_str() -> None:
    @locked(name=lambda: 3)  # type: ignore[arg-type,return-value]
    def job() -> None:
        pass

    with pytest.raises(TypeError, match="non-empty str"):
        job()


# --- async ------------------------------------------------------------------------------


def test_async_lock_heartbeat_fencing_and_exclusion(redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        async with Lock("async-job", ttl=0.6) as lock:
            first = lock.fencing_token
            assert not await Lock("async-job", ttl=1).aacquire()
            await asyncio.sleep(1.5)  # the heartbeat task keeps the 0.6 s lease
            assert redis_client.exists(held_key("async-job"))
            assert not lock.lost
        assert not redis_client.exists(held_key("async-job"))
        async with Lock("async-job", ttl=5) as again:
            assert again.fencing_token > first  # type: ignore[operator]

    asyncio.run(scenario())


def test_async_stolen_lease_raises_lock_lost(redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        async with Lock("async-stolen", ttl=0.6) as lock:
            redis_client.set(held_key("async-stolen"), b"other|1|{}", px=5000)
            for _ in range(100):
                if lock.lost:
                    break
                await asyncio.sleep(0.05)

    with pytest.raises(LockLost):
        asyncio.run(scenario())
    assert redis_client.get(held_key("async-stolen")) == b"other|1|{}"


def test_async_decorated_function_and_multilock() -> None:
    @locked(name="async-fn", ttl=5)
    async def job() -> int | None:
        lock = current_lock()
        return lock.fencing_token if lock else None

    async def scenario() -> None:
        assert isinstance(await job(), int)
        async with MultiLock(["m1", "m2"], ttl=5) as multi:
            assert not await MultiLock(["m2", "m3"], ttl=5).aacquire()
            assert multi.fencing_token is not None

    asyncio.run(scenario())


# --- house rule I1 ----------------------------------------------------------------------


def test_every_lock_and_fencing_key_has_a_ttl(redis_client: redis.Redis) -> None:
    with Lock("ttl-a", ttl=5), MultiLock(["ttl-b", "ttl-c"], ttl=5):
        found = lock_keys(redis_client)
        assert len(found) == 6  # 3 held + 3 fence
        assert all(redis_client.pttl(k) > 0 for k in found)
    fences = lock_keys(redis_client)
    assert len(fences) == 3 and all(b":fence:" in k for k in fences)
    assert all(redis_client.pttl(k) > 29 * 24 * 3600 * 1000 for k in fences)


def test_paused_process_holder_is_fenced_off(redis_client: redis.Redis, redis_url: str) -> None:
    """Kleppmann's GC-pause scenario with a real SIGSTOP (RELIABILITY F14, L-05)."""
    import signal

    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    go = ctx.Event()
    holder = ctx.Process(target=lock_workers.paused_holder, args=(redis_url, child_end, go))
    holder.start()
    try:
        assert parent_end.poll(60)
        fence_a = parent_end.recv()
        os.kill(holder.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            b = Lock("kleppmann", ttl=10, wait=5)
            assert b.acquire()  # A's lease ran out while it was frozen
        finally:
            os.kill(holder.pid, signal.SIGCONT)  # type: ignore[arg-type]
        assert b.fencing_token > fence_a  # type: ignore[operator]
        assert redis_client.eval(lock_workers.FENCED_WRITE, 1, lock_workers.FENCED_STORE,
                                 b.fencing_token, "B") == 1
        go.set()
        assert parent_end.poll(30)
        outcome = parent_end.recv()
        assert outcome == {"lost": True, "write": 0}  # A's stale write refused, A told
        assert b.owned()  # A's release left B's lock alone
        assert redis_client.hget(lock_workers.FENCED_STORE, "by") == b"B"
        b.release()
    finally:
        holder.join(30)


def test_tokens_are_unique_and_reseeded_after_fork() -> None:
    from django_redispatterns.locks._names import new_token

    tokens = {new_token() for _ in range(100_000)}
    assert len(tokens) == 100_000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.write(write, new_token().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    mine = new_token()
    assert child[:32] != mine[:32]  # a forked worker never repeats the parent's tokens
    assert child not in tokens
