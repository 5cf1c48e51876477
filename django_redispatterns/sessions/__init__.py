"""Redis session engine with a per-user index: ``SESSION_ENGINE = "django_redispatterns.sessions"``.

Django imports ``SessionStore`` from here. See ``docs/sessions.md``.

Inside, bottom to top: :mod:`.keyspace` (key layout, naming, which errors mean "Redis is
down"), :mod:`.codec` (signing session data), :mod:`.activity` (the request's device
metadata), :mod:`.runner` (one generator of Redis steps run sync or asyncio), :mod:`.index`
(the per-user index on the Redis side), :mod:`.engine` (``SessionStore``) and :mod:`.api`
(``user_sessions``, ``logout_everywhere``, ``revoke_session``).
"""

from __future__ import annotations

from .activity import USER_AGENT_MAX, current_activity
from .api import Revoked, SessionInfo, logout_everywhere, revoke_session, user_sessions
from .codec import sign_session, unsign_session
from .engine import SessionStore
from .keyspace import KEY_RE, UNAVAILABLE, SessionStoreUnavailable, session_handle, user_tag

__all__ = [
    "KEY_RE",
    "UNAVAILABLE",
    "USER_AGENT_MAX",
    "Revoked",
    "SessionInfo",
    "SessionStore",
    "SessionStoreUnavailable",
    "current_activity",
    "logout_everywhere",
    "revoke_session",
    "session_handle",
    "sign_session",
    "unsign_session",
    "user_sessions",
    "user_tag",
]
