"""Module-level workers for the near cache's multi-process test (spawn needs importable targets).

The writer bumps a version per key through the cache and, once Redis acknowledged the
write, publishes it in a shared array (``acked[k]``). A reader repeatedly notes the
acknowledged version of a random key, and reads that key through its near cache no
earlier than ``bound`` seconds later: it must see that version or a newer one.
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from typing import Any

from tests.redis_servers import CACHE_PREFIX


def _cache(redis_url: str, near: bool) -> Any:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django_redispatterns.cache import RedisCache

    options: dict[str, Any] = {"SOCKET_TIMEOUT": 5}
    if near:
        options["NEAR_CACHE"] = {"MAX_ENTRIES": 5000}
    return RedisCache(redis_url, {"KEY_PREFIX": f"{CACHE_PREFIX}-near", "TIMEOUT": 120,
                                  "OPTIONS": options})


def writer(redis_url: str, start: Any, stop: Any, acked: Any, keys: int, ready: Any) -> None:
    cache = _cache(redis_url, near=False)
    cache.set("k0", 0)
    ready.put("writer")
    start.wait(120)
    versions = [0] * keys
    while not stop.is_set():
        k = random.randrange(keys) if random.random() < 0.5 else random.randrange(20)
        versions[k] += 1
        cache.set(f"k{k}", versions[k])
        acked[k] = versions[k]


def reader(redis_url: str, start: Any, stop: Any, acked: Any, keys: int, bound: float,
           results: Any, ready: Any) -> None:
    """Put ``(checks, violations, local_hits, first_violation)`` on ``results``."""
    cache = _cache(redis_url, near=True)
    cache._near._start().wait_ready(30)
    ready.put("reader")
    start.wait(120)
    pending: deque[tuple[float, int, int]] = deque()
    checks = violations = hits = 0
    first: str | None = None
    while not stop.is_set():
        now = time.monotonic()
        k = random.randrange(keys) if random.random() < 0.5 else random.randrange(20)
        pending.append((now + bound, k, acked[k]))
        while pending and pending[0][0] <= time.monotonic():
            _, key, floor = pending.popleft()
            nkey = str(cache.client.make_key(f"k{key}"))
            local = cache._near.lookup(nkey) is not None
            got = cache.get(f"k{key}", 0)
            checks += 1
            hits += local
            if got < floor:
                violations += 1
                first = first or f"k{key}: read {got} after {floor} was acknowledged"
        # a little work between reads, and a reason for the GIL to switch
        if random.random() < 0.01:
            time.sleep(0.001)
    results.put((checks, violations, hits, first))
    cache._near.stop()
