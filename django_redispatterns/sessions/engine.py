"""The Django session engine: ``SessionStore``, one round trip per load and per save.

``load()`` finds the data from the cookie alone (one ``HMGET``, or none when the
session is held in process memory, :mod:`.memory`), and ``save()`` updates the
data and the user's index in one Lua call on one Cluster slot (see :mod:`.keyspace` for the
layout). A session whose user changes gets a new key (with the new user's tag) when it is
saved. ``load()`` and ``save()`` call the client themselves (the hot path: no step machinery,
their sync and async twins share everything but that call); every other Redis-touching
method is written once as a generator of Redis steps (:mod:`.runner`).
"""

from __future__ import annotations

import functools
import logging
import secrets
from typing import Any, NamedTuple

import redis
from asgiref.sync import sync_to_async
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
from . import memory, previous
from .activity import SessionActivity
from .codec import deserialize, serialize, sign_session, unsign_session
from .keyspace import (
    FORMAT_VERSION,
    UNAVAILABLE,
    SessionStoreUnavailable,
    aclient,
    client,
    is_ours,
    keys_of,
    user_tag,
)
from .runner import Steps, arun, run

logger = logging.getLogger("django_redispatterns.sessions")
security_logger = logging.getLogger("django.security.SuspiciousSession")

# What the last successful save wrote: (session key, serialized data, TTL in seconds).
_State = tuple[str | None, bytes, int]


class _Move(NamedTuple):
    """A save that re-keys the session under its (new) user's tag (``_move_steps``)."""

    serialized: bytes
    ttl_ms: int
    user_id: str


class SessionStore(SessionActivity, SessionBase):
    """Django session engine on Redis, with a per-user index and no resurrection.

    Guarantees beyond Django's contract: ``load()`` and ``save()`` are one round trip each;
    a key this store did not issue is never adopted; a ``save()`` of a session deleted
    meanwhile raises ``UpdateError`` instead of recreating it; when Redis is unreachable
    ``load()`` raises :class:`~django_redispatterns.exceptions.BackendUnavailable` and keeps
    the key, so the middleware never answers by deleting the cookie.
    """

    def __init__(self, session_key: str | None = None) -> None:
        super().__init__(session_key)
        self._activity_ms = None
        self.activity_recorded = False
        self.pending_activity = None
        self.backend_error: BaseException | None = None
        self._saved_state: _State | None = None
        self._previous: SessionBase | None = None  # the previous engine's copy (.previous)

    # -- keys ------------------------------------------------------------------------

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

    # load() and save() are one Redis command each and call the client directly; the other
    # operations (and a save that moves a session to another user) run as steps (.runner).

    def load(self) -> dict[str, Any]:
        if (engine := previous.holding(self.session_key)) is not None:
            return previous.load(self, *engine)
        if (hash_key := self._load_target()) is None:
            return {}
        try:  # the data, its format and last activity (SessionActivityMiddleware's)
            near = memory.memory()
            return self._loaded(*(near.record(hash_key) if near is not None
                                  else client().hmget(hash_key, memory.FIELDS)))
        except UNAVAILABLE as exc:
            raise self._unavailable(exc, action="load") from exc
        except redis.exceptions.ResponseError:
            return self._not_a_session(hash_key)

    async def aload(self) -> dict[str, Any]:
        if (engine := previous.holding(self.session_key)) is not None:
            return await sync_to_async(previous.load)(self, *engine)
        if (hash_key := self._load_target()) is None:
            return {}
        try:
            near = memory.memory()
            return self._loaded(*(await near.arecord(hash_key) if near is not None
                                  else await aclient().hmget(hash_key, memory.FIELDS)))
        except UNAVAILABLE as exc:
            raise self._unavailable(exc, action="load") from exc
        except redis.exceptions.ResponseError:
            return self._not_a_session(hash_key)

    def _load_target(self) -> str | None:
        """The data key to read, or None: not a key of ours (then forgotten)."""
        key = self.session_key
        if not is_ours(key):
            self._session_key = None
            return None
        assert key is not None
        return keys_of(key)[0]

    def _not_a_session(self, hash_key: str) -> dict[str, Any]:
        security_logger.warning("Session data corrupted (not a session hash): %s",
                                hash_key.rpartition(":")[2][:12])
        return self._loaded(None, None, None)

    def _loaded(self, raw: bytes | None, version: bytes | None,
                activity: bytes | None) -> dict[str, Any]:
        if raw is None or version not in (None, FORMAT_VERSION):
            # A miss, or a record of a newer format: never guessed at, left as it is.
            self._session_key = None
            return {}
        session = self._decode_or_none(raw)
        if session is None:
            # Corrupt or tampered data: start afresh under a new key, never reuse this one.
            self._session_key = None
            return {}
        self._activity_ms = int(activity) if activity is not None else None
        user_id = session.get(SESSION_KEY)
        key = self.session_key
        assert key is not None
        if user_id is not None and user_tag(str(user_id)) != key[:32]:
            # Indexed under another tag (e.g. SECRET_KEY rotated): move it on the next save.
            self.modified = True
        return session

    def encode(self, session_dict: dict[str, Any]) -> str:
        return sign_session(serialize(self.serializer, session_dict), self.key_salt)

    def decode(self, session_data: bytes | str) -> dict[str, Any]:
        session = self._decode_or_none(session_data)
        return {} if session is None else session

    def _decode_or_none(self, raw: bytes | str) -> dict[str, Any] | None:
        """Like ``decode()``, but tells corrupt data (None, logged) from an empty session."""
        try:
            session = deserialize(self.serializer, unsign_session(raw, self.key_salt))
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
        if (engine := previous.primary(self.session_key)) is not None:
            return previous.create(self, engine)
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
        if (engine := previous.primary(self.session_key)) is not None:
            return await sync_to_async(previous.create)(self, engine)
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
        if (engine := previous.primary(self.session_key)) is not None:
            data = self._get_session(no_load=must_create)  # type: ignore[attr-defined]
            return previous.save(self, engine, data, must_create)
        if self.session_key is None or (not must_create and not is_ours(self.session_key)):
            return self.create()
        data = self._get_session(no_load=must_create)  # type: ignore[attr-defined]
        call = self._save_call(data, must_create)
        if call is None:
            return
        if isinstance(call, _Move):
            self._run(self._move_steps(*call), "save")
            return
        try:
            saved = scripts.script("session_save")(client(), call[0], call[1])
        except UNAVAILABLE as exc:
            raise self._unavailable(exc, action="save") from exc
        finally:
            memory.forget(call[0][:1])
        self._saved(saved, must_create, call[2])

    async def asave(self, must_create: bool = False) -> None:
        if (engine := previous.primary(self.session_key)) is not None:
            data = await self._aget_session(no_load=must_create)  # type: ignore[attr-defined]
            return await sync_to_async(previous.save)(self, engine, data, must_create)
        if self.session_key is None or (not must_create and not is_ours(self.session_key)):
            return await self.acreate()
        data = await self._aget_session(no_load=must_create)  # type: ignore[attr-defined]
        call = self._save_call(data, must_create)
        if call is None:
            return
        if isinstance(call, _Move):
            await self._arun(self._move_steps(*call), "save")
            return
        try:
            saved = await scripts.script("session_save").acall(aclient(), call[0], call[1])
        except UNAVAILABLE as exc:
            raise self._unavailable(exc, action="save") from exc
        finally:
            memory.forget(call[0][:1])
        self._saved(saved, must_create, call[2])

    def _save_call(self, data: dict[str, Any], must_create: bool
                   ) -> tuple[list[str], list[str | int], _State] | _Move | None:
        """(keys, args, saved state) of the one ``session_save`` call, a move to another
        user's tag, or None when this very state was saved moments ago (by
        SessionActivityMiddleware)."""
        key = self.session_key
        assert key is not None
        serialized = serialize(self.serializer, data)
        ttl_ms = int(self.get_expiry_age(expiry=data.get("_session_expiry"))) * 1000
        if not must_create and self._saved_state == (key, serialized, ttl_ms // 1000):
            return None
        user_id = data.get(SESSION_KEY)
        user_id = str(user_id) if user_id not in (None, "") else None
        if user_id is not None and user_tag(user_id) != key[:32]:
            if not must_create:
                return _Move(serialized, ttl_ms, user_id)
            self._session_key = key = self._get_new_session_key()
        hash_key, index, _ = keys_of(key)
        return ([hash_key, index], self._save_args(serialized, ttl_ms, user_id, create=must_create),
                (key, serialized, ttl_ms // 1000))

    def _saved(self, saved: Any, must_create: bool, state: _State) -> None:
        if not saved:
            raise CreateError if must_create else UpdateError
        self._saved_state = state

    def _save_args(self, serialized: bytes, ttl_ms: int, user_id: str | None, *,
                   create: bool) -> list[str | int]:
        """``session_save``'s arguments (see its header): only those that apply are sent."""
        activity = self._activity_due(self._activity(), new=create)
        flags = ("c" if create else "u") + ("1" if user_id is not None else "0")
        args: list[str | int] = [
            flags if activity is None else flags + "a",
            sign_session(serialized, self.key_salt), ttl_ms,
            int(get_config().feature("SESSIONS")["MAX_PER_USER"]),
        ]
        if create:
            args.append(secrets.token_hex(8))
        if activity is not None:
            args += activity
            self.activity_recorded = True
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
             self._save_args(serialized, ttl_ms, user_id, create=True)),
        ])
        memory.forget([old_data, new_data])
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
        self._saved_state = (new_key, serialized, ttl_ms // 1000)

    def delete(self, session_key: str | None = None) -> None:
        self._run(self._delete_steps(session_key), "delete")

    async def adelete(self, session_key: str | None = None) -> None:
        await self._arun(self._delete_steps(session_key), "delete")

    def _delete_steps(self, session_key: str | None) -> Steps:
        if session_key is None:
            session_key = self.session_key
        if not is_ours(session_key):
            if session_key is not None and (engine := previous.active()) is not None:
                yield ("call", previous.delete, self, engine[0], session_key)
            return
        assert session_key is not None
        if session_key == self.session_key:
            self._saved_state = None
        hash_key, index, sid = keys_of(session_key)
        try:
            yield ("script", "session_delete", [hash_key, index], [sid, ""])
        finally:
            memory.forget([hash_key])

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
