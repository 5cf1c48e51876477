"""Module-level workers for the session tests' 'spawn' processes (no tests in here).

Imports nothing from Django at module level, so a spawned child can import it before
``django.setup()``.
"""

from __future__ import annotations

import os


def create_sessions(redis_url: str, user_id: str, count: int) -> int:
    """Create ``count`` signed-in sessions of ``user_id`` on the parent's Redis."""
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.contrib.auth import SESSION_KEY

    from django_redispatterns.sessions import SessionStore

    for _ in range(count):
        store = SessionStore()
        store[SESSION_KEY] = user_id
        store.save()
    return count
