"""A reader process for the near cache's fault tests (spawn needs importable targets).

The reader holds a near cache and obeys commands from the test (the writer, another
process) on ``cmds``, answering each on ``out``. Times are ``time.monotonic()``, which
is one clock for every process on the machine.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from tests.redis_servers import CACHE_PREFIX

PREFIX = f"{CACHE_PREFIX}-nearfault"


def make(redis_url: str, near: bool = True, **options: Any) -> Any:
    """The cache both sides use (the writer passes ``near=False``)."""
    from django_redispatterns.cache import RedisCache

    opts: dict[str, Any] = {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5, **options}
    if near:
        opts["NEAR_CACHE"] = {"MAX_ENTRIES": 1000}
    return RedisCache(redis_url, {"KEY_PREFIX": PREFIX, "TIMEOUT": 120, "OPTIONS": opts})


def reader(redis_url: str, options: dict[str, Any], cmds: Any, out: Any) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    cache = make(redis_url, **options)
    near = cache._near
    near._start().wait_ready(30)
    out.put("ready")
    while True:
        cmd, *args = cmds.get(timeout=300)
        if cmd == "stop":
            near.stop()
            out.put("stopped")
            return
        out.put(globals()[f"_{cmd}"](cache, *args))


def _held(cache: Any, key: str) -> bool:
    return cache._near.lookup(str(cache.client.make_key(key))) is not None


def _fill(cache: Any, key: str) -> Any:
    """Read ``key`` until it is held locally; its value."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        value = cache.get(key)
        if _held(cache, key):
            return value
        time.sleep(0.01)
    raise AssertionError(f"{key} never held locally")


def _get(cache: Any, key: str) -> tuple[str, Any]:
    try:
        return "ok", cache.get(key)
    except Exception as exc:  # the test looks at what it was
        return "error", type(exc).__name__


def _watch(cache: Any, key: str, new: Any, written: float, seconds: float) -> dict[str, Any]:
    """Read ``key`` in a loop until it reads ``new`` (written, acknowledged, at ``written``)
    or ``seconds`` after ``written``: when ``new`` was first read, and how many reads
    returned something else."""
    stale = 0
    while True:
        began = time.monotonic()
        if began > written + seconds:
            return {"seen_after": None, "stale": stale}
        if cache.get(key) == new:
            return {"seen_after": began - written, "stale": stale}
        stale += 1
        time.sleep(0.001)


def _track_many(cache: Any, names: list[str]) -> int:
    """Make Redis track ``names`` (raw keys) for this process's channel, as fills do, in a
    few MGETs on one tracking fill connection."""
    from django_redispatterns.tracking.listener import CHECKOUT
    from django_redispatterns.tracking.reads import enable_tracking

    near = cache._near
    listener = near.listener
    pool = near._pool
    conn = pool.get_connection(*CHECKOUT)
    try:
        enable_tracking(conn, listener, listener.epoch)
        for i in range(0, len(names), 5000):
            conn.send_command("MGET", *names[i:i + 5000])
            conn.read_response()
    finally:
        pool.release(conn)
    return len(names)


def _aget_loops(cache: Any, key: str, loops: int) -> int:
    """``loops`` event loops, each one ``aget`` miss (as ``async_to_sync`` callers do)."""
    for _ in range(loops):
        cache._near.forget([str(cache.client.make_key(key))])
        asyncio.run(cache.aget(key))
    return loops


def _losses(cache: Any) -> int:
    """How often this process's channel was lost so far."""
    return int(cache._near.listener.losses)
