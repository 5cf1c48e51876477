"""Cache backend: hit cost vs django-redis, and a stampede vs django-redis and dogpile.cache.

Everything runs on a throwaway redis-server started for the run (same machine, same
serializer: pickle) so the numbers compare clients, not servers.

1. ``get`` hit: ``django_redispatterns.cache.RedisCache.get`` vs django-redis ``get``
   (target ratio >= 0.95, i.e. our latency <= 1.05 x theirs).
2. ``get_or_set`` hit: ours vs django-redis ``get_or_set`` vs dogpile.cache
   ``region.get_or_create`` (redis backend, distributed lock).
3. Stampede: 50 threads miss one key whose value takes 100 ms to compute; we count how
   often the callable ran and the p50/p99 latency the callers saw, over 5 rounds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import compare
from tests.redis_servers import RedisServer

THREADS = 50
COMPUTE_SECONDS = 0.1
ROUNDS = 5


def _backends(url: str) -> tuple[Any, Any, Any]:
    from django_redis.cache import RedisCache as DjangoRedisCache
    from dogpile.cache import make_region

    from django_redispatterns.cache import RedisCache

    params = {"KEY_PREFIX": "bench", "TIMEOUT": 300,
              "OPTIONS": {"CONNECTION_POOL_KWARGS": {"max_connections": 500}}}
    ours = RedisCache(url, params)
    theirs = DjangoRedisCache(url, {**params, "KEY_PREFIX": "bench-djr"})
    region = make_region(key_mangler=lambda k: "bench-dogpile:" + k).configure(
        "dogpile.cache.redis",
        expiration_time=300,
        arguments={"url": url, "distributed_lock": True, "lock_timeout": 10,
                   "redis_expiration_time": 330, "thread_local_lock": False,
                   "connection_kwargs": {"max_connections": 500}},
    )
    return ours, theirs, region


GetOrSet = Callable[[str, Callable[[], Any]], Any]


def _stampede(get_or_set: GetOrSet, key: str) -> tuple[int, list[float]]:
    computes: list[int] = []
    lock = threading.Lock()

    def compute() -> dict[str, int]:
        with lock:
            computes.append(1)
        time.sleep(COMPUTE_SECONDS)
        return {"value": 42}

    barrier = threading.Barrier(THREADS)
    latencies: list[float] = []

    def caller() -> None:
        barrier.wait()
        started = time.perf_counter()
        get_or_set(key, compute)
        with lock:
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=caller) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(computes), latencies


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def run() -> None:
    server = RedisServer()
    try:
        ours, theirs, region = _backends(server.url)
        ours.set("hit", {"id": 1, "name": "x" * 100})
        theirs.set("hit", {"id": 1, "name": "x" * 100})
        compare("cache get (hit)", {
            "django_redispatterns RedisCache.get": lambda: ours.get("hit"),
            "django-redis RedisCache.get": lambda: theirs.get("hit"),
        }, ops=5000)
        ours.get_or_set("gos", lambda: {"id": 1})
        theirs.get_or_set("gos", lambda: {"id": 1})
        region.get_or_create("gos", lambda: {"id": 1})
        compare("cache get_or_set (hit)", {
            "django_redispatterns get_or_set": lambda: ours.get_or_set("gos", dict),
            "django-redis get_or_set": lambda: theirs.get_or_set("gos", dict),
            "dogpile.cache get_or_create": lambda: region.get_or_create("gos", dict),
        }, ops=5000)

        contenders: dict[str, GetOrSet] = {
            "django_redispatterns get_or_set": lambda k, f: ours.get_or_set(k, f, 60),
            "django-redis get_or_set": lambda k, f: theirs.get_or_set(k, f, 60),
            "dogpile.cache get_or_create (redis lock)": region.get_or_create,
        }
        print(f"\n## stampede: {THREADS} threads miss one key, compute "
              f"{COMPUTE_SECONDS * 1000:.0f} ms ({ROUNDS} rounds, medians)")
        print(f"{'contender':<42} {'computes':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for name, get_or_set in contenders.items():
            counts, p50s, p99s = [], [], []
            for i in range(ROUNDS):
                count, latencies = _stampede(get_or_set, f"stampede-{i}")
                counts.append(count)
                p50s.append(_pct(latencies, 0.50))
                p99s.append(_pct(latencies, 0.99))
            print(f"{name:<42} {statistics.median(counts):>9.0f} "
                  f"{statistics.median(p50s) * 1000:>8.1f} {statistics.median(p99s) * 1000:>8.1f}")
    finally:
        server.stop()
