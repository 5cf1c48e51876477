"""Module-level workers for the lock tests' spawned processes (spawn needs importable targets)."""

from __future__ import annotations

import os
import time
from typing import Any

from tests.redis_servers import KEY_PREFIX, raw_client

FENCE_LOG = f"{KEY_PREFIX}:locktest:fences"


def _setup(redis_url: str) -> None:
    os.environ["REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def fence_worker(redis_url: str, start: Any, rounds: int) -> None:
    """Acquire one name ``rounds`` times; under the lock, append the fencing token to a log."""
    _setup(redis_url)

    from django_redispatterns.locks import Lock

    client = raw_client(redis_url)
    start.wait(30)
    for _ in range(rounds):
        with Lock("fenced-resource", ttl=10, wait=60) as lock:
            pipe = client.pipeline()
            pipe.rpush(FENCE_LOG, lock.fencing_token)  # type: ignore[arg-type]
            pipe.pexpire(FENCE_LOG, 60_000)
            pipe.execute()


FENCED_STORE = f"{KEY_PREFIX}:locktest:store"
# Test-only stand-in for a fenced database row: accept a write only with a higher token.
FENCED_WRITE = """
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'by', ARGV[2])
redis.call('PEXPIRE', KEYS[1], 60000)
return 1
"""


def paused_holder(redis_url: str, conn: Any, go: Any) -> None:
    """Hold a 1 s lock, report the fencing token, then (after being paused) try to write."""
    _setup(redis_url)

    from django_redispatterns.exceptions import LockLost
    from django_redispatterns.locks import Lock

    client = raw_client(redis_url)
    outcome = {"lost": False}
    try:
        with Lock("kleppmann", ttl=1) as lock:
            conn.send(lock.fencing_token)
            go.wait(30)
            outcome["write"] = client.eval(FENCED_WRITE, 1, FENCED_STORE, lock.fencing_token,
                                           "A")
    except LockLost:
        outcome["lost"] = True
    conn.send(outcome)


def woken_waiter(redis_url: str, conn: Any) -> None:
    """Wait for "wakeup" with a 60 s blocking bound, so only a wake-up can end it early.

    Sends "waiting" once its first attempt failed (the holder is in another process),
    then the seconds from that moment until it held the lock.
    """
    _setup(redis_url)
    from django_redispatterns.locks import Lock, _waiting

    # Blocking and back-off bounds of a minute: only the release's wake-up ends it early.
    _waiting.MAX_BLOCK = _waiting.MIN_DELAY = _waiting.MAX_DELAY = 60.0
    lock = Lock("wakeup", ttl=10, wait=90, auto_renew=False)
    assert not Lock("wakeup", ttl=10, auto_renew=False).acquire()
    conn.send("waiting")
    started = time.monotonic()
    assert lock.acquire()
    conn.send(time.monotonic() - started)
    lock.release()
