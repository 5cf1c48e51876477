"""The public per-user API: list a user's sessions, end one, end them all.

Built on :mod:`.index` (the Redis side); every function raises
:class:`~django_redispatterns.sessions.SessionStoreUnavailable` (a
:class:`~django_redispatterns.exceptions.BackendUnavailable`) when Redis cannot be reached.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from .. import scripts, signals
from ..conf import get_config
from . import index, previous
from .engine import SessionStore
from .keyspace import (
    HANDLE_RE,
    UNAVAILABLE,
    SessionStoreUnavailable,
    client,
    cutoff_key,
    is_ours,
    ms_to_datetime,
    session_handle,
    user_id_of,
    user_tag,
)

logger = logging.getLogger("django_redispatterns.sessions")


@dataclass(frozen=True)
class SessionInfo:
    """One live session of a user, as :func:`user_sessions` lists it.

    ``session_key`` is the session's opaque handle (a hash of the cookie value; the cookie
    itself is never stored nor shown). Pass it to :func:`revoke_session` or as ``keep=``.
    """

    session_key: str
    created: datetime | None
    last_activity: datetime | None
    ip: str
    user_agent: str
    expires: datetime | None
    is_current: bool = False

    @property
    def handle(self) -> str:
        return self.session_key


class Revoked(int):
    """How many sessions :func:`logout_everywhere` deleted, and whether that was all.

    ``complete`` is False while a previous session engine is read (``PREVIOUS_ENGINE``):
    sessions it still holds that were never copied here cannot be found from the user, so
    they end on their next request to a process of this release (a cutoff is checked on
    load), and an old process still accepts them until then.
    """

    complete: bool

    def __new__(cls, count: int, *, complete: bool = True) -> Revoked:
        revoked = super().__new__(cls, count)
        revoked.complete = complete
        return revoked


F = TypeVar("F", bound=Callable[..., Any])


def _redis_required(func: F) -> F:
    """Index operations raise SessionStoreUnavailable (a BackendUnavailable) when Redis
    cannot be reached."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UNAVAILABLE as exc:
            logger.debug("session index unavailable in %s: %s", func.__name__, exc)
            raise SessionStoreUnavailable(f"session store unavailable: {exc}") from exc

    return wrapper  # type: ignore[return-value]


@_redis_required
def user_sessions(user: Any, *, current: str | None = None) -> list[SessionInfo]:
    """The user's live sessions, most recently active first.

    ``user`` is a user or its pk. ``current`` (a session key or handle) marks that session
    ``is_current``. Never more than ``SESSIONS["MAX_PER_USER"]`` (a sign-in beyond it ends
    the user's sessions that expire first), and never more Redis work than that. Index
    members whose session is gone (expired, deleted, evicted) are
    pruned from the index on the way. Metadata (last activity, IP, user agent) is present
    when :class:`~django_redispatterns.middleware.SessionActivityMiddleware` is installed.
    """
    tag = user_tag(user_id_of(user))
    current_sid = session_handle(current) if current else None
    now_ms = time.time() * 1000
    infos = [
        SessionInfo(
            session_key=stored.sid,
            created=ms_to_datetime(stored.created),
            last_activity=ms_to_datetime(stored.activity),
            ip=stored.ip,
            user_agent=stored.user_agent,
            expires=ms_to_datetime(int(now_ms + stored.pttl)),
            is_current=stored.sid == current_sid,
        )
        for stored in index.live_sessions(client(), tag, int(
            get_config().feature("SESSIONS")["MAX_PER_USER"]))
    ]
    epoch = datetime.fromtimestamp(0, tz=timezone.utc)
    infos.sort(key=lambda s: s.last_activity or s.created or epoch, reverse=True)
    return infos


@_redis_required
def logout_everywhere(user: Any, *, keep: str | None = None) -> Revoked:
    """Delete every session of ``user`` except ``keep``; return how many were deleted.

    The count is a :class:`Revoked` (an ``int``): its ``complete`` is False while a previous
    session engine is read, whose sessions of the user end on their next load here.

    ``keep`` is a session key (e.g. ``request.session.session_key``) or a handle. Runs in
    batches of 500 (one Lua call each), so a user with thousands of sessions never blocks
    Redis. Every session that existed when the call started is gone when it returns.
    Sends :data:`~django_redispatterns.signals.sessions_revoked`. Idempotent.
    """
    user_id = user_id_of(user)
    tag = user_tag(user_id)
    switching = previous.active() is not None
    if switching and keep and not is_ours(keep) and not HANDLE_RE.fullmatch(keep):
        keep = previous.adopted_key(keep, user_id)  # the previous engine's key: its copy
    keep_sid = session_handle(keep) if keep else ""
    if switching:  # before the index: a copy made meanwhile is newer than the cutoff
        scripts.script("session_cutoff")(client(), [cutoff_key(tag)],
                                         [previous.cutoff_ttl_ms(), keep_sid])
    deleted = Revoked(index.revoke_all(client(), tag, keep_sid), complete=not switching)
    logger.info("revoked %d session(s) of user %s", deleted, tag[:12])
    signals.sessions_revoked.send(sender=SessionStore, user_id=user_id, count=deleted,
                                  kept=keep_sid or None)
    return deleted


@_redis_required
def revoke_session(user: Any, session_key: str) -> bool:
    """Delete one session of ``user`` by key or handle; False if it is not theirs or gone.

    A handle of another user's session never deletes it: the lookup is confined to
    ``user``'s own index slot.
    """
    user_id = user_id_of(user)
    deleted = index.revoke_one(client(), user_tag(user_id), session_handle(session_key))
    if deleted:
        signals.sessions_revoked.send(sender=SessionStore, user_id=user_id, count=1,
                                      kept=None)
    return deleted
