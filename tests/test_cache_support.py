"""Helpers shared by tests/test_cache*.py and their spawned worker processes (no tests here)."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from tests.redis_servers import CACHE_PREFIX, raw_client

PREFIX = CACHE_PREFIX
# Connecting includes the TLS handshake over a rediss:// run: a hundred coroutines
# connecting at once take longer than 5 s for their handshakes on a loaded machine.
CONNECT_TIMEOUT = 30 if os.environ.get("REDIS_URL", "").startswith("rediss://") else 5


def make_cache(url: str, **options: Any) -> Any:
    """A fresh backend instance on ``url`` with extra OPTIONS."""
    from django_redispatterns.cache import RedisCache

    params: dict[str, Any] = {
        "KEY_PREFIX": options.pop("KEY_PREFIX", PREFIX),
        "TIMEOUT": options.pop("TIMEOUT", 300),
        "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT, **options},
    }
    return RedisCache(url, params)


def counting(client: redis.Redis, counter: str, value: Any = "computed", sleep: float = 0.0,
             error: type[BaseException] | None = None) -> Any:
    """A callable that counts its runs in Redis (visible across processes)."""

    def compute() -> Any:
        client.incr(counter)
        client.expire(counter, 120)
        if sleep:
            time.sleep(sleep)
        if error is not None:
            raise error("computer failed")
        return value

    return compute


def ttl_less_keys(client: redis.Redis) -> list[bytes]:
    """Keys under the cache test prefix without a TTL (house rule I1)."""
    return [k for k in client.scan_iter(match=f"{PREFIX}*", count=1000) if client.pttl(k) == -1]


# --- spawned worker processes ------------------------------------------------------------


def setup_django_child() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def stampede_worker(url: str, key: str, counter: str, threads: int, start_at: float,
                    results: Any, sleep: float = 0.4, socket_timeout: float = 5) -> None:
    """One process of the multi-process stampede: ``threads`` missers of ``key``, each
    computing for ``sleep`` seconds if it gets to."""
    import threading

    setup_django_child()
    cache = make_cache(url, STAMPEDE_LEASE=10, SOCKET_TIMEOUT=socket_timeout)
    client = raw_client(url)
    compute = counting(client, counter, value={"v": 42}, sleep=sleep)
    got: list[Any] = []

    def run() -> None:
        time.sleep(max(0.0, start_at - time.time()))
        got.append(cache.get_or_set(key, compute, 60))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    results.put(got)


def dying_computer(url: str, key: str, counter: str) -> None:
    """Takes the compute lock, then hangs until the test SIGKILLs this process."""
    setup_django_child()
    cache = make_cache(url, STAMPEDE_LEASE=1.0)
    client = raw_client(url)

    def compute() -> Any:
        client.incr(counter)
        client.expire(counter, 120)
        time.sleep(600)
        return "never"

    cache.get_or_set(key, compute, 60)


def wake_waiter(url: str, key: str, ready: str, threads: int, results: Any) -> None:
    """A process whose threads miss ``key`` while another process computes it; reports
    the values and the wall-clock time each thread got its value."""
    import threading

    setup_django_child()
    # A 10 s socket timeout lets one BLMOVE block 9.75 s: a waiter that was not woken
    # would return seconds after the value landed.
    cache = make_cache(url, STAMPEDE_LEASE=30, SOCKET_TIMEOUT=10)
    client = raw_client(url)
    got: list[Any] = []
    finished: list[float] = []

    def run() -> None:
        got.append(cache.get_or_set(key, lambda: "waiter computed", 60))
        finished.append(time.time())

    workers = [threading.Thread(target=run) for _ in range(threads)]
    client.incr(ready)
    client.expire(ready, 120)
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    results.put((got, finished))
