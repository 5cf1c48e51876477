"""Near cache: a hot-key hit from process memory, a miss, and how fast invalidations land.

Everything runs on a throwaway redis-server started for the run (loopback, pickle).

1. Hot-key hit: ``RedisCache.get`` with ``NEAR_CACHE`` vs Django's ``LocMemCache.get``
   (goal: at most 1.5x its latency) and vs django-redis ``get`` (goal: at most 0.1x).
2. Miss: a key in no local store and not in Redis — the near cache's fill (one EVALSHA of
   GET+PTTL) vs our backend without ``NEAR_CACHE`` (one GET); goal at most 1.05x. And a
   local miss that Redis answers (fill + store + LRU eviction) vs a plain hit in Redis.
3. Invalidation latency: another connection writes a key held locally; from the write's
   acknowledgement to the local entry's removal, p50/p99 over 1000 writes, with the
   process idle and with a thread busy reading local hits (GIL contention).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from typing import Any

from benchmarks.harness import compare
from tests.redis_servers import RedisServer

SAMPLES = 1000


def _caches(url: str) -> tuple[Any, Any, Any, Any, Any]:
    from django.core.cache.backends.locmem import LocMemCache
    from django_redis.cache import RedisCache as DjangoRedisCache

    from django_redispatterns.cache import RedisCache

    params: dict[str, Any] = {"KEY_PREFIX": "bench", "TIMEOUT": 300}
    near = RedisCache(url, {**params, "OPTIONS": {"NEAR_CACHE": {"MAX_ENTRIES": 1000}}})
    churn = RedisCache(url, {**params, "OPTIONS": {"NEAR_CACHE": {"MAX_ENTRIES": 10}}})
    plain = RedisCache(url, params)
    theirs = DjangoRedisCache(url, {**params, "KEY_PREFIX": "bench-djr"})
    locmem = LocMemCache("bench", {"TIMEOUT": 300})
    return near, churn, plain, theirs, locmem


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _latency(near: Any, writer: Any, busy: bool) -> list[float]:
    """Seconds from each write's acknowledgement to its invalidation landing locally."""
    listener = near._near.listener
    landed = threading.Event()
    landed_at: list[float] = []
    watched = str(near.client.make_key("watched"))
    deliver = listener._invalidate

    def invalidate(nkeys: list[str]) -> None:
        deliver(nkeys)
        if watched in nkeys:
            landed_at.append(time.monotonic())
            landed.set()

    listener._invalidate = invalidate
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            near.get("hot")

    spinner = threading.Thread(target=spin)
    if busy:
        spinner.start()
    samples: list[float] = []
    try:
        for i in range(SAMPLES):
            near.get("watched")  # filled: tracked, held locally
            landed.clear()
            landed_at.clear()
            writer.set("watched", i)
            acked = time.monotonic()
            if landed.wait(5):
                samples.append(max(0.0, landed_at[0] - acked))
    finally:
        stop.set()
        if busy:
            spinner.join()
        listener._invalidate = deliver
    return samples


def run() -> None:
    server = RedisServer()
    try:
        near, churn, plain, theirs, locmem = _caches(server.url)
        value = {"id": 1, "name": "x" * 100}
        for c in (near, plain, theirs, locmem):
            c.set("hot", value)
        near._near._start().wait_ready(10)
        churn._near._start().wait_ready(10)
        near.get("hot")
        assert near._near.lookup(str(near.client.make_key("hot"))) is not None
        hit = compare("near cache get (hot key, local hit)", {
            "RedisCache.get, NEAR_CACHE": lambda: near.get("hot"),
            "LocMemCache.get": lambda: locmem.get("hot"),
            "django-redis RedisCache.get": lambda: theirs.get("hot"),
        }, ops=20000)
        miss = compare("cache get (key in no cache)", {
            "RedisCache.get, NEAR_CACHE": lambda: near.get("absent"),
            "RedisCache.get": lambda: plain.get("absent"),
        }, ops=3000)
        for i in range(2000):
            plain.set(f"churn{i}", value)
        keys = itertools.cycle([f"churn{i}" for i in range(2000)])
        fill = compare("cache get (local miss, Redis hit, LRU full)", {
            "RedisCache.get, NEAR_CACHE (fill)": lambda: churn.get(next(keys)),
            "RedisCache.get": lambda: plain.get("hot"),
        }, ops=3000)
        print("\nlatency ratios (ours / theirs, time per call; lower is faster):")
        for results in (hit, miss, fill):
            ours = results[0]
            for other in results[1:]:
                print(f"  {results[0].scenario}: vs {other.contender}: "
                      f"{other.median / ours.median:.3f}x")
        writer = plain
        print(f"\n## invalidation latency (write acknowledged -> local entry gone), "
              f"{SAMPLES} writes")
        for busy in (False, True):
            samples = _latency(near, writer, busy)
            label = "busy reader thread" if busy else "idle process"
            print(f"{label:<22} p50 {statistics.median(samples) * 1000:.3f} ms  "
                  f"p99 {_pct(samples, 0.99) * 1000:.3f} ms  max {max(samples) * 1000:.3f} ms "
                  f"({len(samples)} landed)")
        near._near.stop()
        churn._near.stop()
    finally:
        server.stop()
