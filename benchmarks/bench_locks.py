"""Locks: ours vs redis-py's Lock and python-redis-lock (one Redis), vs pottery's Redlock (3).

Scenarios:
1. uncontended acquire+release cycles (one thread, fresh lock object per cycle);
2. contended: 8 threads on one name for a fixed time — throughput and fairness;
3. Redlock: acquire+release over 3 independent masters (ours in quorum mode vs pottery).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis_lock  # python-redis-lock
from pottery import Redlock

from benchmarks.harness import compare
from django_redispatterns import connection
from django_redispatterns.conf import get_config
from django_redispatterns.locks import Lock
from tests.redis_servers import RedisServer


def _ours(name: str, **kwargs: Any) -> Callable[[], None]:
    def cycle() -> None:
        lock = Lock(name, ttl=10, **kwargs)
        lock.acquire()
        lock.release()
    return cycle


def _redis_py(client: redis.Redis, name: str) -> Callable[[], None]:
    def cycle() -> None:
        lock = client.lock(name, timeout=10)
        lock.acquire(blocking=False)
        lock.release()
    return cycle


RELEASE_IF_OURS = "if redis.call('GET', KEYS[1]) == ARGV[1] then " \
    "return redis.call('DEL', KEYS[1]) end return 0"


def _floor(client: redis.Redis, name: str) -> Callable[[], None]:
    """The least a leased, owner-checked lock can do: SET NX PX, then a Lua release."""
    release = client.register_script(RELEASE_IF_OURS)
    token = "f" * 32

    def cycle() -> None:
        client.set(name, token, nx=True, px=10_000)
        release(keys=[name], args=[token])
    return cycle


def _prl(client: redis.Redis, name: str) -> Callable[[], None]:
    def cycle() -> None:
        lock = redis_lock.Lock(client, name, expire=10)
        lock.acquire(blocking=False)
        lock.release()
    return cycle


def _contended(label: str, cycle: Callable[[], None], seconds: float = 3.0,
               threads: int = 8) -> dict[str, Any]:
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        while time.monotonic() < stop:
            cycle()
            counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    total = sum(counts)
    jain = total**2 / (threads * sum(c * c for c in counts)) if total else 0.0
    return {"contender": label, "rate": total / elapsed, "jain": jain,
            "min": min(counts), "max": max(counts)}


def run() -> None:
    # The same client (and pool) our locks use, so every contender pays the same transport.
    raw = connection.client_for(get_config().connection_for("LOCKS"))

    compare(
        "locks: uncontended acquire+release (one thread)",
        {
            "django-redispatterns Lock (heartbeat on)": _ours("bench-a"),
            "django-redispatterns Lock (auto_renew=False)": _ours("bench-b", auto_renew=False),
            "floor: SET NX PX + Lua release": _floor(raw, "bench-e"),
            "redis-py Lock": _redis_py(raw, "bench-c"),
            "python-redis-lock Lock": _prl(raw, "bench-d"),
        },
        ops=1000,
        rounds=5,
    )

    def ours_blocking() -> None:
        with Lock("bench-contended", ttl=10, wait=30):
            pass

    def redis_py_blocking() -> None:
        with raw.lock("bench-contended-rpy", timeout=10, blocking_timeout=30):
            pass

    def prl_blocking() -> None:
        with redis_lock.Lock(raw, "bench-contended-prl", expire=10):
            pass

    print("\n## locks: contended, 8 threads on one name, 3 s each (median of 3 runs)")
    print(f"{'contender':<40} {'acq/s':>10} {'Jain fairness':>14} {'min..max per thread':>20}")
    for label, fn in (("django-redispatterns Lock", ours_blocking),
                      ("redis-py Lock (sleep 0.1 s)", redis_py_blocking),
                      ("python-redis-lock (BLPOP wake-up)", prl_blocking)):
        runs = [_contended(label, fn) for _ in range(3)]
        best = sorted(runs, key=lambda r: r["rate"])[1]
        print(f"{label:<40} {statistics.median(r['rate'] for r in runs):>10,.0f} "
              f"{best['jain']:>14.2f} {best['min']:>9}..{best['max']}")

    masters = [RedisServer() for _ in range(3)]
    try:
        urls = [m.url for m in masters]
        clients = [redis.Redis.from_url(u) for u in urls]

        def ours_quorum() -> None:
            lock = Lock("bench-redlock", ttl=10, quorum=urls)
            lock.acquire()
            lock.release()

        def pottery_quorum() -> None:
            lock = Redlock(key="bench-redlock-pottery", masters=clients, auto_release_time=10)
            lock.acquire(blocking=False)
            lock.release()

        compare(
            "locks: Redlock acquire+release over 3 masters",
            {"django-redispatterns Lock(quorum=3)": ours_quorum,
             "pottery Redlock": pottery_quorum},
            ops=300,
            rounds=5,
            warmup=50,
        )
    finally:
        for m in masters:
            m.stop()
