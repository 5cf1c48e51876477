"""The request's device metadata, handed from ``SessionActivityMiddleware`` to the engine.

The middleware sets :data:`current_activity` for the request it serves, so that a session
``save()`` can record last activity, IP and user agent in the same round trip.
:class:`SessionActivity` is the engine's part: when activity is due, and writing it alone.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

from django.contrib.auth import SESSION_KEY

from .. import scripts
from ..conf import get_config
from . import memory
from .keyspace import UNAVAILABLE, client, is_ours, keys_of

logger = logging.getLogger("django_redispatterns.sessions")

USER_AGENT_MAX = 300

# (stored ip, truncated user agent) of the request being served.
current_activity: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "django_redispatterns_session_activity", default=None
)


class SessionActivity:
    """Last activity, IP and user agent of a signed-in session (mixed into ``SessionStore``)."""

    session_key: Any  # SessionBase's
    # Last activity (ms) as loaded; whether this request wrote it already; the (ip, user
    # agent) SessionActivityMiddleware set when it runs inside SessionMiddleware (outside
    # it, :data:`current_activity` says it).
    _activity_ms: int | None
    activity_recorded: bool
    pending_activity: tuple[str, str] | None

    def _cached_user_id(self) -> str | None:
        data = getattr(self, "_session_cache", None) or {}
        user_id = data.get(SESSION_KEY)
        return str(user_id) if user_id not in (None, "") else None

    def _activity(self) -> tuple[str, str] | None:
        if self.pending_activity is not None:
            return self.pending_activity
        return current_activity.get()

    def _activity_due(self, activity: tuple[str, str] | None, *,
                      new: bool) -> tuple[str, str] | None:
        if activity is None or self.activity_recorded or self._cached_user_id() is None:
            return None
        if new or self._activity_ms is None:
            return activity
        interval = float(get_config().feature("SESSIONS")["ACTIVITY_INTERVAL"]) * 1000
        return activity if time.time() * 1000 - self._activity_ms >= interval else None

    def record_activity(self, activity: tuple[str, str]) -> bool:
        """Write last activity, IP and user agent of a signed-in session if due.

        Called by :class:`~django_redispatterns.middleware.SessionActivityMiddleware` after
        the response, at most once per ``ACTIVITY_INTERVAL`` (and not at all when this
        request's save already wrote them). Never recreates a deleted session; a Redis
        error is logged, not raised. Returns True when written.
        """
        key = self.session_key
        if not is_ours(key) or getattr(self, "_session_cache", None) is None:
            return False
        due = self._activity_due(activity, new=False)
        if due is None:
            return False
        assert key is not None
        hash_key = keys_of(key)[0]
        try:
            done = scripts.script("session_touch")(client(), [hash_key], list(due))
        except UNAVAILABLE as exc:
            logger.warning("session activity not recorded: %s", exc)
            return False
        finally:
            memory.forget([hash_key])
        self.activity_recorded = True
        return bool(done)
