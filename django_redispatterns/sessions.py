"""Redis session engine with a per-user index: ``SESSION_ENGINE = "django_redispatterns.sessions"``.

Layout (see docs/sessions.md). A session key is ``<tag><secret>``: 32 hex digits of hash tag
plus 32 random ``[a-z0-9]`` characters. The tag of a signed-in user's session is
``identity_hash(user id)``; an anonymous session gets a random tag. Redis never sees the key
itself, only ``sid = blake2b(key)``:

* ``<prefix>:sess:{tag}:s:<sid>`` — a hash: ``d`` the signed data (Django's
  ``SESSION_SERIALIZER``), ``c`` created, ``a`` last activity, ``ip``, ``ua``; TTL = expiry age;
* ``<prefix>:sess:{tag}:u`` — the user's index, a sorted set ``sid -> expiry (ms, within
  60 s)`` that outlives its longest-lived member by at most 60 s.

So ``load()`` finds the data from the cookie alone (one ``HGET``), and ``save()`` updates the
data and the index in one Lua call on one Cluster slot. A session whose user changes gets a new
key (with the new user's tag) when it is saved. Every Redis-touching method is written once as
a generator of Redis steps, run by a sync or an asyncio runner.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import hmac
import logging
import re
import secrets
import time
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.base import (
    VALID_KEY_CHARS,
    CreateError,
    SessionBase,
    UpdateError,
)
from django.core import signing
from django.utils.crypto import get_random_string

from . import connection, keys, scripts, signals
from .conf import get_config
from .exceptions import BackendUnavailable

__all__ = [
    "SessionInfo",
    "SessionStore",
    "logout_everywhere",
    "revoke_session",
    "session_handle",
    "user_sessions",
]

logger = logging.getLogger("django_redispatterns.sessions")
security_logger = logging.getLogger("django.security.SuspiciousSession")

FEATURE = "sess"
KEY_RE = re.compile(r"[0-9a-f]{32}[0-9a-z]{32}")
HANDLE_RE = re.compile(r"[0-9a-f]{32}")
USER_AGENT_MAX = 300
REVOKE_BATCH = 500
LIST_BATCH = 500

# Errors that mean "Redis is not there": the request gets a 503, the cookie stays (SPEC D3).
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

# (ip, user agent) of the request being served, set by SessionActivityMiddleware so that a
# save() can record activity in the same round trip.
current_activity: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "django_redispatterns_session_activity", default=None
)


# --- naming -----------------------------------------------------------------------------


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


def _data_key(tag: str, sid: str) -> str:
    return keys.make_key(FEATURE, "s", sid, tag=tag)


def _index_key(tag: str) -> str:
    return keys.make_key(FEATURE, "u", tag=tag)


def _keys_of(session_key: str) -> tuple[str, str, str]:
    """(data key, index key, sid) of a well-formed session key."""
    tag = session_key[:32]
    sid = session_handle(session_key)
    return _data_key(tag, sid), _index_key(tag), sid


def _is_ours(session_key: str | None) -> bool:
    return bool(session_key) and KEY_RE.fullmatch(session_key or "") is not None


def _user_id_of(user: Any) -> str:
    """The string Django stores under ``_auth_user_id`` for ``user`` (a user or a pk)."""
    if getattr(user, "is_anonymous", False) is True:
        raise ValueError("an anonymous user has no sessions index; pass a user or a user id")
    meta = getattr(user, "_meta", None)
    if meta is not None:
        return str(meta.pk.value_to_string(user))
    if user is None or user == "":
        raise ValueError("a user or a user id is required")
    return str(user)


def _client() -> Any:
    return connection.get_client("SESSIONS")


def _aclient() -> Any:
    return connection.get_async_client("SESSIONS")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms_to_datetime(value: Any) -> datetime | None:
    if value in (None, b"", ""):
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc)


# --- signing ------------------------------------------------------------------------------
# Byte-for-byte Django's ``signing.dumps(..., compress=True)`` / ``signing.loads`` format
# (TimestampSigner, HMAC-SHA256, SECRET_KEY_FALLBACKS honoured), with the HMAC key derived
# once per (salt, secret) instead of on every call, and zlib tried only when it can pay off.
# Data written by either side reads on the other (tests/test_sessions.py checks both ways).

COMPRESS_MIN_BYTES = 200


@functools.lru_cache(maxsize=32)
def _hmac_key(salt: str, secret: str | bytes) -> bytes:
    # django.utils.crypto.salted_hmac(key_salt=salt + "signer", secret=secret).
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256((salt + "signer").encode() + raw).digest()


def _signature(salt: str, value: str, secret: str | bytes) -> str:
    digest = hmac.digest(_hmac_key(salt, secret), value.encode(), "sha256")
    return signing.b64_encode(digest).decode()


def sign_session(data: bytes, salt: str) -> str:
    """``signing.dumps(obj, salt=salt, serializer=..., compress=True)`` for serialized ``data``."""
    prefix = ""
    if len(data) >= COMPRESS_MIN_BYTES:
        compressed = zlib.compress(data)
        if len(compressed) < len(data) - 1:
            data, prefix = compressed, "."
    value = f"{prefix}{signing.b64_encode(data).decode()}:{signing.b62_encode(int(time.time()))}"
    return f"{value}:{_signature(salt, value, settings.SECRET_KEY)}"


def unsign_session(signed: str, salt: str) -> bytes:
    """The serialized data of a ``signing.dumps`` value; ``BadSignature`` if not genuine."""
    value, _, sig = signed.rpartition(":")
    if not value:
        raise signing.BadSignature("no signature")
    for secret in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS):
        if hmac.compare_digest(sig.encode(), _signature(salt, value, secret).encode()):
            break
    else:
        raise signing.BadSignature("signature does not match")
    payload = value.rpartition(":")[0].encode()  # drop the timestamp (no max_age)
    if payload[:1] == b".":
        return zlib.decompress(signing.b64_decode(payload[1:]))
    return signing.b64_decode(payload)


# --- executing steps --------------------------------------------------------------------

# One Redis operation of a session step: ("hget", key, field), ("hmget", key, fields),
# ("hexists", key, field), ("script", name, keys, args) or ("many", [(name, keys, args)]).
Op = tuple[Any, ...]
Steps = Generator[Op, Any, Any]


def _execute(client: Any, op: Op) -> Any:
    kind = op[0]
    if kind == "script":
        return scripts.script(op[1])(client, op[2], op[3])
    if kind == "many":
        return scripts.run_many(client, [(scripts.script(n), k, a) for n, k, a in op[1]])
    return getattr(client, kind)(op[1], op[2])


async def _aexecute(client: Any, op: Op) -> Any:
    kind = op[0]
    if kind == "script":
        return await scripts.script(op[1]).acall(client, op[2], op[3])
    if kind == "many":
        return await scripts.arun_many(client, [(scripts.script(n), k, a) for n, k, a in op[1]])
    return await getattr(client, kind)(op[1], op[2])


# --- the engine -------------------------------------------------------------------------


class SessionStore(SessionBase):
    """Django session engine on Redis, with a per-user index and no resurrection.

    Guarantees beyond Django's contract: ``load()`` and ``save()`` are one round trip each;
    a key this store did not issue is never adopted; a ``save()`` of a session deleted
    meanwhile raises ``UpdateError`` instead of recreating it; when Redis is unreachable
    ``load()`` raises :class:`~django_redispatterns.exceptions.BackendUnavailable` and keeps
    the key, so the middleware never answers by deleting the cookie.
    """

    def __init__(self, session_key: str | None = None) -> None:
        super().__init__(session_key)
        self._activity_ms: int | None = None
        self.activity_recorded = False
        self.backend_error: BaseException | None = None
        # (ip, user agent) set by SessionActivityMiddleware when it runs inside
        # SessionMiddleware; outside it, the ``current_activity`` context variable says it.
        self.pending_activity: tuple[str, str] | None = None
        self._saved_state: tuple[str | None, bytes, int] | None = None

    # -- keys ------------------------------------------------------------------------

    def _cached_user_id(self) -> str | None:
        data = getattr(self, "_session_cache", None) or {}
        user_id = data.get(SESSION_KEY)
        return str(user_id) if user_id not in (None, "") else None

    def _unavailable(self, exc: BaseException, action: str) -> BackendUnavailable:
        self.backend_error = exc
        logger.error("session store unavailable during %s: %s", action, exc)
        error = BackendUnavailable(f"session store unavailable during {action}: {exc}")
        error.__cause__ = exc
        return error

    # -- running steps ---------------------------------------------------------------
    # Each Redis-touching method is written once, as a generator of Redis operations
    # (``_*_steps``); ``_run`` executes them on the sync client and ``_arun`` on the
    # asyncio one, so the sync and async APIs share every decision.

    # A Redis error raised by the steps themselves (a failed call inside a pipeline) goes
    # through _step too, so READONLY in a pipeline slot is a BackendUnavailable as well.

    def _run(self, steps: Steps, action: str) -> Any:
        client, (more, value) = _client(), self._step(steps, action)
        while more:
            try:
                more, value = self._step(steps, action, _execute(client, value))
            except redis.exceptions.RedisError as exc:
                more, value = self._step(steps, action, error=exc)
        return value

    async def _arun(self, steps: Steps, action: str) -> Any:
        client, (more, value) = _aclient(), self._step(steps, action)
        while more:
            try:
                more, value = self._step(steps, action, await _aexecute(client, value))
            except redis.exceptions.RedisError as exc:
                more, value = self._step(steps, action, error=exc)
        return value

    def _step(self, steps: Steps, action: str, result: Any = None,
              error: BaseException | None = None) -> tuple[bool, Any]:
        """Feed one outcome to ``steps``: (True, next operation) or (False, its value).

        An unreachable Redis becomes ``BackendUnavailable`` (the key is kept); a
        ``ResponseError`` is thrown into the steps, which may handle it.
        """
        if isinstance(error, UNAVAILABLE):
            raise self._unavailable(error, action) from error
        if error is not None and not isinstance(error, redis.exceptions.ResponseError):
            raise error
        try:
            return True, (steps.throw(error) if error is not None else steps.send(result))
        except StopIteration as done:
            return False, done.value

    # -- SessionBase contract ----------------------------------------------------------

    def load(self) -> dict[str, Any]:
        return self._run(self._load_steps(), "load")

    async def aload(self) -> dict[str, Any]:
        return await self._arun(self._load_steps(), "load")

    def _load_steps(self) -> Steps:
        key = self.session_key
        if not _is_ours(key):
            self._session_key = None
            return {}
        assert key is not None
        sid = session_handle(key)
        data_key = _data_key(key[:32], sid)
        try:
            if self._activity() is None:  # no activity middleware: the data only
                raw, activity = (yield ("hget", data_key, "d")), None
            else:
                raw, activity = yield ("hmget", data_key, ["d", "a"])
        except redis.exceptions.ResponseError:
            security_logger.warning("Session data corrupted (not a session hash): %s", sid[:12])
            raw = None
        if raw is None:
            self._session_key = None
            return {}
        session = self._decode_or_none(raw)
        if session is None:
            # Corrupt or tampered data: start afresh under a new key, never reuse this one.
            self._session_key = None
            return {}
        self._activity_ms = int(activity) if activity is not None else None
        user_id = session.get(SESSION_KEY)
        if user_id is not None and user_tag(str(user_id)) != key[:32]:
            # Indexed under another tag (e.g. SECRET_KEY rotated): move it on the next save.
            self.modified = True
        return dict(session)

    def encode(self, session_dict: dict[str, Any]) -> str:
        return sign_session(self.serializer().dumps(session_dict), self.key_salt)

    def decode(self, session_data: bytes | str) -> dict[str, Any]:
        session = self._decode_or_none(session_data)
        return {} if session is None else session

    def _decode_or_none(self, raw: bytes | str) -> dict[str, Any] | None:
        """Like ``decode()``, but tells corrupt data (None, logged) from an empty session."""
        try:
            text = raw.decode() if isinstance(raw, bytes) else raw
            session = self.serializer().loads(unsign_session(text, self.key_salt))
        except signing.BadSignature:
            security_logger.warning("Session data corrupted")
            return None
        except Exception:  # undecodable bytes, a serializer error: Django returns {} too
            security_logger.warning("Session data could not be decoded")
            return None
        if not isinstance(session, dict):
            security_logger.warning("Session data is not a mapping")
            return None
        return session

    def exists(self, session_key: str | None) -> bool:
        return bool(self._run(self._exists_steps(session_key), "exists"))

    async def aexists(self, session_key: str | None) -> bool:
        return bool(await self._arun(self._exists_steps(session_key), "exists"))

    def _exists_steps(self, session_key: str | None) -> Steps:
        if not _is_ours(session_key):
            return False
        assert session_key is not None
        try:
            return bool((yield ("hexists", _keys_of(session_key)[0], "d")))
        except redis.exceptions.ResponseError:
            return False

    def _get_new_session_key(self) -> str:
        # No exists() round trip: collisions are caught by the create script (CreateError).
        user_id = self._cached_user_id()
        tag = user_tag(user_id) if user_id is not None else secrets.token_hex(16)
        return tag + get_random_string(32, VALID_KEY_CHARS)

    async def _aget_new_session_key(self) -> str:
        return self._get_new_session_key()

    def create(self) -> None:
        for _ in range(100):  # a collision of 165 random bits is a bug, not bad luck
            self._session_key = self._get_new_session_key()
            try:
                self.save(must_create=True)
            except CreateError:
                continue
            self.modified = True
            return
        raise RuntimeError("Unable to create a new session key.")

    async def acreate(self) -> None:
        for _ in range(100):
            self._session_key = self._get_new_session_key()
            try:
                await self.asave(must_create=True)
            except CreateError:
                continue
            self.modified = True
            return
        raise RuntimeError("Unable to create a new session key.")

    def save(self, must_create: bool = False) -> None:
        if self.session_key is None or (not must_create and not _is_ours(self.session_key)):
            return self.create()
        data = self._get_session(no_load=must_create)  # type: ignore[attr-defined]
        self._run(self._save_steps(data, must_create), "save")

    async def asave(self, must_create: bool = False) -> None:
        if self.session_key is None or (not must_create and not _is_ours(self.session_key)):
            return await self.acreate()
        data = await self._aget_session(no_load=must_create)  # type: ignore[attr-defined]
        await self._arun(self._save_steps(data, must_create), "save")

    def _save_steps(self, data: dict[str, Any], must_create: bool) -> Steps:
        key = self.session_key
        assert key is not None
        serialized: bytes = self.serializer().dumps(data)
        ttl_ms = int(self.get_expiry_age(expiry=data.get("_session_expiry"))) * 1000
        if not must_create and self._saved_state == (key, serialized, ttl_ms // 1000):
            return  # this very state was saved moments ago (by SessionActivityMiddleware)
        user_id = data.get(SESSION_KEY)
        user_id = str(user_id) if user_id not in (None, "") else None
        if user_id is not None and user_tag(user_id) != key[:32]:
            if not must_create:
                yield from self._move_steps(serialized, ttl_ms, user_id)
                self._saved_state = (self.session_key, serialized, ttl_ms // 1000)
                return
            self._session_key = key = self._get_new_session_key()
        data_key, index_key, sid = _keys_of(key)
        args = self._save_args(serialized, ttl_ms, sid, user_id, create=must_create)
        if not (yield ("script", "session_save", [data_key, index_key], args)):
            raise CreateError if must_create else UpdateError
        self._saved_state = (key, serialized, ttl_ms // 1000)

    def _save_args(self, serialized: bytes, ttl_ms: int, sid: str, user_id: str | None, *,
                   create: bool) -> list[str | int]:
        activity = self._activity_due(self._activity(), new=create)
        args: list[str | int] = [
            "c" if create else "u", sign_session(serialized, self.key_salt), ttl_ms, sid,
            "1" if user_id is not None else "0",
            secrets.token_hex(8) if create else "",
        ]
        if activity is not None:
            args += ["1", activity[0], activity[1]]
            self.activity_recorded = True
        else:
            args += ["0", "", ""]
        return args

    def _move_steps(self, serialized: bytes, ttl_ms: int, user_id: str) -> Steps:
        """Re-key a session whose user changed: the old key goes, a new one is created.

        One pipeline: the old key is removed only if it still exists (else ``UpdateError``
        and the new key is removed again — no resurrection).
        """
        old_key = self.session_key
        assert old_key is not None
        new_key = user_tag(user_id) + get_random_string(32, VALID_KEY_CHARS)
        old_data, old_index, old_sid = _keys_of(old_key)
        new_data, new_index, new_sid = _keys_of(new_key)
        moved, created = yield ("many", [
            ("session_delete", [old_data, old_index], [old_sid, secrets.token_hex(8)]),
            ("session_save", [new_data, new_index],
             self._save_args(serialized, ttl_ms, new_sid, user_id, create=True)),
        ])
        for result in (moved, created):
            if isinstance(result, Exception):
                raise result
        if not moved:
            yield ("script", "session_delete", [new_data, new_index], [new_sid, ""])
            raise UpdateError
        if not created:  # a collision of 165 random bits; try once more under another key
            yield from self._move_steps(serialized, ttl_ms, user_id)
            return
        self._session_key = new_key

    def delete(self, session_key: str | None = None) -> None:
        self._run(self._delete_steps(session_key), "delete")

    async def adelete(self, session_key: str | None = None) -> None:
        await self._arun(self._delete_steps(session_key), "delete")

    def _delete_steps(self, session_key: str | None) -> Steps:
        if session_key is None:
            session_key = self.session_key
        if not _is_ours(session_key):
            return
        assert session_key is not None
        if session_key == self.session_key:
            self._saved_state = None
        data_key, index_key, sid = _keys_of(session_key)
        yield ("script", "session_delete", [data_key, index_key], [sid, ""])

    def cycle_key(self) -> None:
        self._activity_ms = None  # a new key: its activity is recorded afresh
        super().cycle_key()

    async def acycle_key(self) -> None:
        self._activity_ms = None
        await super().acycle_key()

    def flush(self) -> None:
        self._activity_ms = None
        super().flush()

    async def aflush(self) -> None:
        self._activity_ms = None
        await super().aflush()

    @classmethod
    def clear_expired(cls) -> None:
        """Nothing to do: Redis expires sessions and :func:`user_sessions` prunes indexes."""

    @classmethod
    async def aclear_expired(cls) -> None:
        """Nothing to do (see :meth:`clear_expired`)."""

    # -- activity ----------------------------------------------------------------------

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
        if not _is_ours(key) or getattr(self, "_session_cache", None) is None:
            return False
        due = self._activity_due(activity, new=False)
        if due is None:
            return False
        assert key is not None
        try:
            done = scripts.script("session_touch")(_client(), [_keys_of(key)[0]], list(due))
        except UNAVAILABLE as exc:
            logger.warning("session activity not recorded: %s", exc)
            return False
        self.activity_recorded = True
        return bool(done)


# --- the per-user index ------------------------------------------------------------------


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


F = TypeVar("F", bound=Callable[..., Any])


def _redis_required(func: F) -> F:
    """Index operations raise BackendUnavailable (logged) when Redis cannot be reached."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UNAVAILABLE as exc:
            logger.error("session index unavailable in %s: %s", func.__name__, exc)
            raise BackendUnavailable(f"session store unavailable: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def _members(client: Any, index_key: str) -> Iterator[list[str]]:
    """The index's members in batches (ZSCAN: bounded work per call)."""
    batch: list[str] = []
    for member, _score in client.zscan_iter(index_key, count=LIST_BATCH):
        batch.append(_text(member))
        if len(batch) >= LIST_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


@_redis_required
def user_sessions(user: Any, *, current: str | None = None) -> list[SessionInfo]:
    """The user's live sessions, most recently active first.

    ``user`` is a user or its pk. ``current`` (a session key or handle) marks that session
    ``is_current``. Index members whose session is gone (expired, deleted, evicted) are
    pruned from the index on the way. Metadata (last activity, IP, user agent) is present
    when :class:`~django_redispatterns.middleware.SessionActivityMiddleware` is installed.
    """
    tag = user_tag(_user_id_of(user))
    index_key = _index_key(tag)
    current_sid = session_handle(current) if current else None
    client = _client()
    infos: list[SessionInfo] = []
    now_ms = time.time() * 1000
    for batch in _members(client, index_key):
        pipe = client.pipeline(transaction=False)
        for sid in batch:
            pipe.hmget(_data_key(tag, sid), ["c", "a", "ip", "ua", "d"])
            pipe.pttl(_data_key(tag, sid))
        replies = pipe.execute()
        dead = []
        for i, sid in enumerate(batch):
            created, activity, ip, ua, data = replies[2 * i]
            pttl = replies[2 * i + 1]
            if data is None or pttl is None or pttl < 0:
                dead.append(sid)
                continue
            infos.append(SessionInfo(
                session_key=sid,
                created=_ms_to_datetime(created),
                last_activity=_ms_to_datetime(activity),
                ip=_text(ip) if ip is not None else "",
                user_agent=_text(ua) if ua is not None else "",
                expires=_ms_to_datetime(int(now_ms + pttl)),
                is_current=sid == current_sid,
            ))
        if dead:
            client.zrem(index_key, *dead)
    epoch = datetime.fromtimestamp(0, tz=timezone.utc)
    infos.sort(key=lambda s: s.last_activity or s.created or epoch, reverse=True)
    return infos


@_redis_required
def logout_everywhere(user: Any, *, keep: str | None = None) -> int:
    """Delete every session of ``user`` except ``keep``; return how many were deleted.

    ``keep`` is a session key (e.g. ``request.session.session_key``) or a handle. Runs in
    batches of 500 (one Lua call each), so a user with thousands of sessions never blocks
    Redis. Every session that existed when the call started is gone when it returns.
    Sends :data:`~django_redispatterns.signals.sessions_revoked`. Idempotent.
    """
    user_id = _user_id_of(user)
    tag = user_tag(user_id)
    index_key = _index_key(tag)
    keep_sid = session_handle(keep) if keep else ""
    revoke = scripts.script("session_revoke")
    client = _client()
    deleted = 0
    batch: list[str] = []
    while True:
        result = revoke(client, [index_key, *(_data_key(tag, sid) for sid in batch)],
                        [keep_sid, REVOKE_BATCH, *batch])
        deleted += int(result[0])
        batch = [_text(sid) for sid in result[1]]
        if not batch:
            break
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
    tag = user_tag(_user_id_of(user))
    sid = session_handle(session_key)
    deleted = scripts.script("session_delete")(
        _client(), [_data_key(tag, sid), _index_key(tag)], [sid, ""]
    )
    if deleted:
        signals.sessions_revoked.send(sender=SessionStore, user_id=_user_id_of(user), count=1,
                                      kept=None)
    return bool(deleted)
