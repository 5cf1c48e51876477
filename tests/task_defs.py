"""Tasks for tests/test_tasks*.py: the same bodies under Django's tasks and under Celery.

Every run appends ``<event> <task> <item> <fencing token> <pid> <time>`` to a list on the
main test Redis (``RUNS``), so a test can tell which runs overlapped, in what order, and
with which fencing token, wherever the worker process ran.
"""

from __future__ import annotations

import os
import time

import redis
from django.conf import settings

from django_redispatterns.exceptions import LockLost
from tests.redis_servers import KEY_PREFIX, raw_client

RUNS = f"{KEY_PREFIX}:tasktest:runs"


def log(event: str, task: str, item: str, fence: object = "-") -> None:
    # The tests' own bookkeeping: the harness's user (the app's may lack RPUSH), the run's
    # certificates over rediss://, and one client per process: a TLS handshake per entry
    # takes over a second on a loaded machine, longer than a "1/2s" task's window.
    client = raw_client(os.environ.get("RPTEST_HARNESS_URL") or settings.REDIS_URL)
    pipe = client.pipeline()
    pipe.rpush(RUNS, f"{event} {task} {item} {fence} {os.getpid()} {time.time():.3f}")
    pipe.pexpire(RUNS, 120_000)
    pipe.execute()


def runs(client: redis.Redis) -> list[list[str]]:
    return [entry.decode().split() for entry in client.lrange(RUNS, 0, -1)]


def hold_body(task: str, item: str, seconds: float, fence: int | None) -> int | None:
    """Log the start, stay busy ``seconds`` (in Python, so a LockLost can land), log the end."""
    log("start", task, item, fence)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(0.02)
    except LockLost:
        log("lost", task, item, fence)
        raise
    log("end", task, item, fence)
    return fence
