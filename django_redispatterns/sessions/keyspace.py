"""Where a session lives in Redis: key layout, naming, and what counts as "Redis is down".

A session key is ``<tag><secret>``: 32 hex digits of hash tag plus 32 random ``[a-z0-9]``
characters. The tag of a signed-in user's session is ``identity_hash(user id)``; an
anonymous session gets a random tag. Redis never sees the key itself, only
``sid = blake2b(key)``:

* ``<prefix>:sess:{tag}:s:<sid>`` — a hash: ``d`` the signed data, ``c`` created, ``a`` last
  activity, ``ip``, ``ua``; TTL = expiry age;
* ``<prefix>:sess:{tag}:u`` — the user's index, a sorted set ``sid -> expiry (ms, within
  60 s)`` that outlives its longest-lived member by at most 60 s;
* ``<prefix>:sess:{tag}:k`` — while a previous session engine is read: when the user's
  sessions were all ended (ms), so the previous engine's copies end too.
"""

from __future__ import annotations

import functools
import hashlib
import re
from datetime import datetime, timezone
from typing import Any

import redis
from django.conf import settings

from .. import connection, keys
from ..exceptions import BackendUnavailable

FEATURE = "sess"
# The format of the session records this release writes (field ``v``; 0.1.0 wrote none).
# A release that changes the format also renames the data field, so that an older release
# (which reads ``d`` only) finds no session instead of misreading one.
FORMAT_VERSION = b"1"
KEY_RE = re.compile(r"[0-9a-f]{32}[0-9a-z]{32}")
HANDLE_RE = re.compile(r"[0-9a-f]{32}")

# Errors that mean "Redis is not there": the request gets a 503, the cookie stays.
# On Redis Cluster, CLUSTERDOWN / TRYAGAIN / "TTL exhausted" are ResponseErrors too: they
# must not be mistaken for corrupt session data (that would log the user out).
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError, ClusterUnavailable
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,  # a demoted primary behind a plain URL
    redis.exceptions.OutOfMemoryError,  # maxmemory reached under noeviction: writes refused
    redis.exceptions.SlotNotCoveredError,
)


class SessionStoreUnavailable(BackendUnavailable):
    """The session store (or a user's index) could not be reached; the session is intact.

    ``SessionActivityMiddleware`` answers it with a 503 that leaves the cookie alone.
    """


def session_handle(session_key: str) -> str:
    """The opaque id under which a session is stored and listed (never the key itself).

    Accepts a session key or a handle (returned unchanged), so callers can pass either.
    """
    if HANDLE_RE.fullmatch(session_key):
        return session_key
    return hashlib.blake2b(session_key.encode(), digest_size=16).hexdigest()


def user_tag(user_id: str) -> str:
    """The hash tag (and session-key prefix) of a user's sessions: a keyed hash of the id."""
    return _user_tag(user_id, settings.SECRET_KEY)


@functools.lru_cache(maxsize=4096)
def _user_tag(user_id: str, secret: str) -> str:
    # ``secret`` is only part of the cache key: a rotated SECRET_KEY gives new tags.
    return keys.identity_hash(user_id, purpose="sessions.user")


def data_key(tag: str, sid: str) -> str:
    """The Redis key of one session's hash."""
    return keys.make_key(FEATURE, "s", sid, tag=tag)


def index_key(tag: str) -> str:
    """The Redis key of a user's index (same hash tag as the user's sessions)."""
    return keys.make_key(FEATURE, "u", tag=tag)


def cutoff_key(tag: str) -> str:
    """The Redis key of a user's "sessions ended at" time (same hash tag as the index)."""
    return keys.make_key(FEATURE, "k", tag=tag)


def keys_of(session_key: str) -> tuple[str, str, str]:
    """(data key, index key, sid) of a well-formed session key."""
    return _keys_of(keys.prefix(), session_key)


@functools.lru_cache(maxsize=4096)
def _keys_of(prefix: str, session_key: str) -> tuple[str, str, str]:
    # ``prefix`` is only part of the cache key: another KEY_PREFIX gives other names.
    tag = session_key[:32]
    sid = session_handle(session_key)
    return data_key(tag, sid), index_key(tag), sid


def is_ours(session_key: str | None) -> bool:
    """Whether ``session_key`` has the shape of a key this engine issues."""
    return bool(session_key) and KEY_RE.fullmatch(session_key or "") is not None


def user_id_of(user: Any) -> str:
    """The string Django stores under ``_auth_user_id`` for ``user`` (a user or a pk)."""
    if getattr(user, "is_anonymous", False) is True:
        raise ValueError("an anonymous user has no sessions index; pass a user or a user id")
    meta = getattr(user, "_meta", None)
    if meta is not None:
        return str(meta.pk.value_to_string(user))
    if user is None or user == "":
        raise ValueError("a user or a user id is required")
    return str(user)


def client() -> Any:
    """The sync Redis client of ``SESSIONS``."""
    return connection.get_client("SESSIONS")


def aclient() -> Any:
    """The asyncio Redis client of ``SESSIONS``."""
    return connection.get_async_client("SESSIONS")


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ms_to_datetime(value: Any) -> datetime | None:
    if value in (None, b"", ""):
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc)
