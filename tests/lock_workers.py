"""Module-level workers for the lock tests' spawned processes (spawn needs importable targets)."""

from __future__ import annotations

import os
from typing import Any

FENCE_LOG = "rptest:locktest:fences"


def _setup(redis_url: str) -> None:
    os.environ["REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def fence_worker(redis_url: str, start: Any, rounds: int) -> None:
    """Acquire one name ``rounds`` times; under the lock, append the fencing token to a log."""
    _setup(redis_url)
    import redis

    from django_redispatterns.locks import Lock

    client = redis.Redis.from_url(redis_url)
    start.wait(30)
    for _ in range(rounds):
        with Lock("fenced-resource", ttl=10, wait=60) as lock:
            pipe = client.pipeline()
            pipe.rpush(FENCE_LOG, lock.fencing_token)  # type: ignore[arg-type]
            pipe.pexpire(FENCE_LOG, 60_000)
            pipe.execute()
