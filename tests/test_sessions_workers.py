"""Module-level workers for the session tests' 'spawn' processes (no tests in here).

Imports nothing from Django at module level, so a spawned child can import it before
``django.setup()``.
"""

from __future__ import annotations

import os


def create_sessions(redis_url: str, user_id: str, count: int,
                    max_per_user: int | None = None) -> int:
    """Create ``count`` signed-in sessions of ``user_id`` on the parent's Redis.

    ``max_per_user`` overrides ``SESSIONS["MAX_PER_USER"]`` in the child.
    """
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import SESSION_KEY
    from django.test import override_settings

    from django_redispatterns.sessions import SessionStore

    config = dict(settings.REDIS_PATTERNS)
    if max_per_user is not None:
        config["SESSIONS"] = {**config.get("SESSIONS", {}), "MAX_PER_USER": max_per_user}
    with override_settings(REDIS_PATTERNS=config):
        for _ in range(count):
            store = SessionStore()
            store[SESSION_KEY] = user_id
            store.save()
    return count
