"""Another process holding session copies in memory (spawn needs an importable target).

The test (a second process) signs sessions in and revokes them; this process loads them
through the session engine with ``SESSIONS["NEAR_CACHE"]`` on, obeying commands on
``cmds`` and answering each on ``out``. Times are ``time.monotonic()``, one clock for
every process on the machine.
"""

from __future__ import annotations

import os
import time
from typing import Any


def reader(config: dict[str, Any], cmds: Any, out: Any) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    from django.conf import settings

    django.setup()
    settings.REDIS_PATTERNS = config
    settings.SESSION_ENGINE = "django_redispatterns.sessions"
    out.put("ready")
    while True:
        cmd, *args = cmds.get(timeout=300)
        if cmd == "stop":
            from django_redispatterns.sessions import memory

            memory.stop()
            out.put("stopped")
            return
        out.put(globals()[f"_{cmd}"](*args))


def _user_of(session_key: str) -> Any:
    from django.contrib.auth import SESSION_KEY

    from django_redispatterns.sessions import SessionStore

    return SessionStore(session_key).load().get(SESSION_KEY)


def _held(session_key: str) -> bool:
    from django_redispatterns.sessions import memory
    from django_redispatterns.sessions.keyspace import keys_of

    near = memory.memory()
    return near is not None and near.reads.lookup(keys_of(session_key)[0]) is not None


def _fill(session_key: str) -> Any:
    """Load ``session_key`` until this process holds it; its user id."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        user = _user_of(session_key)
        if _held(session_key):
            return user
        time.sleep(0.01)
    raise AssertionError("the session was never held in memory")


def _watch(session_key: str, seconds: float) -> dict[str, Any]:
    """Load ``session_key`` in a loop until it is gone (or ``seconds`` pass): when the
    first load began that found it gone, and how many loads found it before."""
    found = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        if _user_of(session_key) is None:
            return {"gone_at": began, "found": found}
        found += 1
    return {"gone_at": None, "found": found}
