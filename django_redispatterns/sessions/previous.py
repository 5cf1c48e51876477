"""Switching from another session engine with no one signed out (``PREVIOUS_ENGINE``).

Until ``PREVIOUS_ENGINE_UNTIL``, a cookie this engine did not issue is looked up in the
previous engine (Django's ``cache``, ``cached_db`` or ``db`` engine, django-redis-sessions'
``redis_sessions.session``, ...):

* ``"primary"`` mode (old processes still serve): the previous engine keeps holding such a
  session. Loads read it there, saves write it there (an old process reads every change a
  new one made), and a session created on a new process is created there. Each signed-in
  session is also mirrored into its user's index, so :func:`user_sessions` lists it and
  :func:`logout_everywhere` ends it.
* ``"read-through"`` mode (every process runs this engine): a previous engine's session is
  moved here on first use, under a key derived from the old one by keyed hash (no old key,
  no user id in a key name; the same old cookie always moves to the same key, so a move
  repeated by a concurrent request keeps what was written since), and the cookie is
  reissued. The old record keeps only a marker naming the user: a request still carrying
  the old cookie finds the moved session, and nothing once that session has ended.

:func:`logout_everywhere` deletes the user's copies here and stamps a cutoff; a previous
engine's session of that user loaded here afterwards is ended (deleted there as well) unless
its copy here was made after the cutoff.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timezone
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends import cache as cache_engine
from django.contrib.sessions.backends import cached_db
from django.contrib.sessions.backends.base import CreateError, SessionBase, UpdateError

from .. import keys, scripts
from ..conf import get_config
from ..exceptions import ConfigurationError
from . import memory
from .codec import serialize, sign_session
from .keyspace import UNAVAILABLE, client, cutoff_key, is_ours, keys_of, user_tag

# The engine's SessionStore (not imported: it imports this module).
SessionStore = Any

logger = logging.getLogger("django_redispatterns.sessions")

PRIMARY, READ_THROUGH = "primary", "read-through"
# What a moved session leaves in the previous engine: its user id ("" when anonymous).
MOVED = "_redispatterns_moved"
_DOWN: tuple[type[BaseException], ...] = (*UNAVAILABLE, OSError)


def active() -> tuple[type[SessionBase], str] | None:
    """(previous engine's ``SessionStore``, mode) while the switch lasts, else None."""
    sessions = get_config().feature("SESSIONS")
    path = sessions["PREVIOUS_ENGINE"]
    if path is None:
        return None
    until = sessions["PREVIOUS_ENGINE_UNTIL"]
    if until is not None and datetime.now(timezone.utc) >= until:
        return None
    return _engine(path), sessions["PREVIOUS_ENGINE_MODE"]


def holding(session_key: str | None) -> tuple[type[SessionBase], str] | None:
    """The previous engine and its mode when ``session_key`` is one it may hold."""
    if session_key is None or is_ours(session_key):
        return None
    return active()


def primary(session_key: str | None) -> type[SessionBase] | None:
    """The previous engine while it is primary and ``session_key`` is not one of ours."""
    if session_key is not None and is_ours(session_key):
        return None
    engine = active()
    return engine[0] if engine is not None and engine[1] == PRIMARY else None


@functools.lru_cache(maxsize=8)
def _engine(path: str) -> type[SessionBase]:
    try:
        engine: type[SessionBase] = import_module(path).SessionStore
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"REDIS_PATTERNS['SESSIONS']['PREVIOUS_ENGINE'] = {path!r} is not a session "
            f"engine with a SessionStore: {exc}") from exc
    return engine


def cutoff_ttl_ms() -> int:
    """How long a cutoff is kept: the longest a previous engine's session lives."""
    return max(int(settings.SESSION_COOKIE_AGE), 1) * 1000


def adopted_key(old_key: str, user_id: str | None) -> str:
    """This engine's key for the previous engine's session ``old_key`` (keyed hashes)."""
    tag = (user_tag(user_id) if user_id is not None
           else keys.identity_hash(old_key, purpose="sessions.adopted.tag"))
    return tag + keys.identity_hash(old_key, purpose="sessions.adopted")


def _user_id(data: dict[str, Any]) -> str | None:
    user_id = data.get(SESSION_KEY)
    return str(user_id) if user_id not in (None, "") else None


def _read(old: SessionBase) -> dict[str, Any]:
    """The previous engine's data; raises when its store cannot be reached."""
    if isinstance(old, cache_engine.SessionStore) and not isinstance(old, cached_db.SessionStore):
        # Django's cache engine answers an unreachable cache with a miss (the user would be
        # signed out for good): its one read, done here so that an error stays an error.
        try:
            data = old._cache.get(old.cache_key)  # type: ignore[attr-defined]
        except _DOWN:
            raise
        except Exception:  # a value that does not decode: a miss, as Django has it
            logger.warning("a previous engine's session could not be decoded")
            data = None
        if not isinstance(data, dict):
            old._session_key = None
            return {}
        return dict(data)
    return old.load()


def load(store: SessionStore, engine: type[SessionBase], mode: str) -> dict[str, Any]:
    """``store.load()`` for a cookie the previous engine issued (see the module docstring)."""
    old_key = store.session_key
    assert old_key is not None
    old = engine(old_key)
    try:
        data = _read(old)
    except Exception as exc:  # its store is down (a database, a cache): keep the cookie
        raise store._unavailable(exc, action="load") from exc
    if old.session_key is None or not data:
        store._session_key = None
        return {}
    if MOVED in data:  # moved here before: the old record only says where to
        store._session_key = adopted_key(old_key, data[MOVED] or None)
        moved_data: dict[str, Any] = store.load()  # the key is ours now: this engine's load
        store.modified = bool(moved_data)  # reissue the cookie
        return moved_data
    user_id = _user_id(data)
    try:
        if user_id is not None and _cut_off(old_key, user_id):
            logger.info("ended a previous engine's session of user %s (logged out everywhere)",
                        user_tag(user_id)[:12])
            old.delete()
            store._session_key = None
            return {}
        if mode == PRIMARY:
            store._previous = old
            return data
        new_key = adopted_key(old_key, user_id)
        moved = _write(store, new_key, data, "v")
    except UNAVAILABLE as exc:
        raise store._unavailable(exc, action="load") from exc
    if moved != 1:  # moved before (a concurrent request): what is here is newer
        data = store._decode_or_none(moved) or {}
    else:
        _mark_moved(old, user_id)
    store._session_key = new_key
    store.modified = True  # the cookie is reissued with the new key
    return data


def _mark_moved(old: SessionBase, user_id: str | None) -> None:
    """Replace the previous engine's data by a marker naming the user, so that the old
    cookie keeps finding the moved session, and only it: once that ends (a log-out, a
    ``logout_everywhere``), the old cookie cannot bring the session back."""
    old._session_cache = {}  # type: ignore[attr-defined]
    old[MOVED] = user_id or ""
    try:
        old.save()
    except Exception as exc:  # the move stands; only the old cookie's way back stays open
        logger.warning("a moved session could not be marked in the previous engine: %s", exc)


def _cut_off(old_key: str, user_id: str) -> bool:
    """Whether ``logout_everywhere`` ended this user's sessions after this one was copied."""
    data_key, _, sid = keys_of(adopted_key(old_key, user_id))
    pipe = client().pipeline(transaction=False)
    pipe.hget(data_key, "c")
    pipe.get(cutoff_key(user_tag(user_id)))
    copied, cutoff = pipe.execute(raise_on_error=False)
    if cutoff is None or isinstance(cutoff, Exception):
        return False
    at, _, kept = cutoff.decode().partition(":")
    if kept == sid:
        return False
    return not isinstance(copied, bytes) or int(copied) < int(at)


def _write(store: SessionStore, new_key: str, data: dict[str, Any], mode: str) -> Any:
    data_key, index, _ = keys_of(new_key)
    ttl_ms = int(store.get_expiry_age(expiry=data.get("_session_expiry"))) * 1000
    signed = sign_session(serialize(store.serializer, data), store.key_salt)
    indexed = "1" if _user_id(data) is not None else "0"
    try:
        return scripts.script("session_adopt")(client(), [data_key, index],
                                               [mode, signed, max(ttl_ms, 1), indexed])
    finally:
        memory.forget([data_key])


def create(store: SessionStore, engine: type[SessionBase]) -> None:
    """``store.create()`` while the previous engine is primary: created there."""
    old = engine()
    old._session_cache = getattr(store, "_session_cache", {})  # type: ignore[attr-defined]
    try:
        old.create()
    except Exception as exc:
        raise store._unavailable(exc, action="create") from exc
    store._previous = old
    store._session_key = old.session_key
    store.modified = True


def save(store: SessionStore, engine: type[SessionBase], data: dict[str, Any],
         must_create: bool) -> None:
    """``store.save()`` while the previous engine is primary: written there, mirrored here."""
    old: SessionBase = (store._previous if store._previous is not None
                        else engine(store.session_key))
    old._session_cache = {}  # type: ignore[attr-defined]
    for name, value in data.items():  # item by item: an engine may watch (user-sessions)
        old[name] = value
    try:
        old.save(must_create=must_create)
    except Exception as exc:
        if isinstance(exc, (CreateError, UpdateError)):
            raise
        raise store._unavailable(exc, action="save") from exc
    store._previous = old
    store._session_key = old.session_key
    if _user_id(data) is not None and old.session_key is not None:
        try:
            _write(store, adopted_key(old.session_key, _user_id(data)), data, "m")
        except UNAVAILABLE as exc:
            raise store._unavailable(exc, action="save") from exc


def delete(store: SessionStore, engine: type[SessionBase], session_key: str) -> None:
    """``store.delete(key)`` of a previous engine's key: there, and its copy here."""
    try:
        engine(session_key).delete(session_key)
    except Exception as exc:
        raise store._unavailable(exc, action="delete") from exc
    cached = getattr(store, "_session_cache", None) or {}
    user_id = _user_id(cached)
    if user_id is None:
        return
    data_key, index, sid = keys_of(adopted_key(session_key, user_id))
    try:
        scripts.script("session_delete")(client(), [data_key, index], [sid, ""])
    except UNAVAILABLE as exc:
        raise store._unavailable(exc, action="delete") from exc
    finally:
        memory.forget([data_key])
