"""The request's device metadata, handed from ``SessionActivityMiddleware`` to the engine.

The middleware sets :data:`current_activity` for the request it serves, so that a session
``save()`` can record last activity, IP and user agent in the same round trip.
"""

from __future__ import annotations

import contextvars

USER_AGENT_MAX = 300

# (stored ip, truncated user agent) of the request being served.
current_activity: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "django_redispatterns_session_activity", default=None
)
