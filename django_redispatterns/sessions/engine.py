"""The Django session engine: ``SessionStore``, one round trip per load and per save.

``load()`` finds the data from the cookie alone (one ``HGET``), and ``save()`` updates the
data and the user's index in one Lua call on one Cluster slot (see :mod:`.keyspace` for the
layout). A session whose user changes gets a new key (with the new user's tag) when it is
saved. Every Redis-touching method is written once as a generator of Redis steps
(:mod:`.runner`).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from typing import Any

import redis
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.base import (
    VALID_KEY_CHARS,
    CreateError,
    SessionBase,
    UpdateError,
)
from django.core import signing
from django.utils.crypto import get_random_string

from .. import scripts
from ..conf import get_config
from .activity import current_activity
from .codec import sign_session, unsign_session
from .keyspace import (
    UNAVAILABLE,
    SessionStoreUnavailable,
    client,
    is_ours,
    keys_of,
    user_tag,
)
from .runner import Steps, arun, run

logger = logging.getLogger("django_redispatterns.sessions")
security_logger = logging.getLogger("django.security.SuspiciousSession")


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

    def _unavailable(self, exc: BaseException, *, action: str) -> SessionStoreUnavailable:
        self.backend_error = exc
        # Not logged louder: the caller decides (SessionActivityMiddleware logs one warning).
        logger.debug("session store unavailable during %s: %s", action, exc)
        error = SessionStoreUnavailable(f"session store unavailable during {action}: {exc}")
        error.__cause__ = exc
        return error

    # -- running steps (see .runner) ------------------------------------------------

    def _run(self, steps: Steps, action: str) -> Any:
        return run(steps, functools.partial(self._unavailable, action=action))

    async def _arun(self, steps: Steps, action: str) -> Any:
        return await arun(steps, functools.partial(self._unavailable, action=action))

    # -- SessionBase contract ----------------------------------------------------------

    def load(self) -> dict[str, Any]:
        return self._run(self._load_steps(), "load")

    async def aload(self) -> dict[str, Any]:
        return await self._arun(self._load_steps(), "load")

    def _load_steps(self) -> Steps:
        key = self.session_key
        if not is_ours(key):
            self._session_key = None
            return {}
        assert key is not None
        hash_key, _, sid = keys_of(key)
        try:
            if self._activity() is None:  # no activity middleware: the data only
                raw, activity = (yield ("hget", hash_key, "d")), None
            else:
                raw, activity = yield ("hmget", hash_key, ["d", "a"])
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
            session = self.serializer().loads(unsign_session(raw, self.key_salt))
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
        if not is_ours(session_key):
            return False
        assert session_key is not None
        try:
            return bool((yield ("hexists", keys_of(session_key)[0], "d")))
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
        if self.session_key is None or (not must_create and not is_ours(self.session_key)):
            return self.create()
        data = self._get_session(no_load=must_create)  # type: ignore[attr-defined]
        self._run(self._save_steps(data, must_create), "save")

    async def asave(self, must_create: bool = False) -> None:
        if self.session_key is None or (not must_create and not is_ours(self.session_key)):
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
        hash_key, index, sid = keys_of(key)
        args = self._save_args(serialized, ttl_ms, sid, user_id, create=must_create)
        if not (yield ("script", "session_save", [hash_key, index], args)):
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
        args.append(int(get_config().feature("SESSIONS")["MAX_PER_USER"]))
        return args

    def _move_steps(self, serialized: bytes, ttl_ms: int, user_id: str) -> Steps:
        """Re-key a session whose user changed: the old key goes, a new one is created.

        One pipeline: the old key is removed only if it still exists (else ``UpdateError``
        and the new key is removed again — no resurrection).
        """
        old_key = self.session_key
        assert old_key is not None
        new_key = user_tag(user_id) + get_random_string(32, VALID_KEY_CHARS)
        old_data, old_index, old_sid = keys_of(old_key)
        new_data, new_index, new_sid = keys_of(new_key)
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
        if not is_ours(session_key):
            return
        assert session_key is not None
        if session_key == self.session_key:
            self._saved_state = None
        hash_key, index, sid = keys_of(session_key)
        yield ("script", "session_delete", [hash_key, index], [sid, ""])

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
        if not is_ours(key) or getattr(self, "_session_cache", None) is None:
            return False
        due = self._activity_due(activity, new=False)
        if due is None:
            return False
        assert key is not None
        try:
            done = scripts.script("session_touch")(client(), [keys_of(key)[0]], list(due))
        except UNAVAILABLE as exc:
            logger.warning("session activity not recorded: %s", exc)
            return False
        self.activity_recorded = True
        return bool(done)
