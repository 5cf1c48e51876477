"""Switching session engines: bad input and faults (in-process, on the real Redis).

The previous engine's store down, a truncated record there, a record of a newer format
here, a session written before records had a format version, and settings that cannot work.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.cache import SessionStore as CacheStore
from django.contrib.sessions.backends.db import SessionStore as DbStore
from django.contrib.sessions.models import Session
from django.core.cache import caches
from django.test import override_settings

from django_redispatterns.conf import build_config
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.sessions import (
    SessionStore,
    SessionStoreUnavailable,
    logout_everywhere,
    user_sessions,
)
from django_redispatterns.sessions.keyspace import keys_of
from django_redispatterns.sessions.previous import adopted_key
from tests.compat import requires_django_5

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]

CACHE = "django.contrib.sessions.backends.cache"
DB = "django.contrib.sessions.backends.db"


def switching(engine: str, mode: str = "read-through", **more: Any) -> Any:
    return override_settings(REDIS_PATTERNS={
        **settings.REDIS_PATTERNS,
        "SESSIONS": {"PREVIOUS_ENGINE": engine, "PREVIOUS_ENGINE_MODE": mode, **more},
    })


def signed_in(store_class: type, user_id: str = "7") -> str:
    old = store_class()
    old[SESSION_KEY] = user_id
    old["data"] = "kept"
    old.save()
    assert old.session_key is not None
    key: str = old.session_key
    return key


@pytest.mark.parametrize(("section", "message"), [
    ({"PREVIOUS_ENGINE_MODE": "both"}, "PREVIOUS_ENGINE_MODE"),
    ({"PREVIOUS_ENGINE_UNTIL": "next tuesday"}, "not an ISO 8601"),
    ({"PREVIOUS_ENGINE_UNTIL": "2030-01-01T00:00:00"}, "needs a time zone"),
    ({"PREVIOUS_ENGINE": "django_redispatterns.sessions"}, "names this engine"),
])
def test_settings_that_cannot_work_are_refused(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build_config({"SESSIONS": section})


def test_a_previous_engine_that_does_not_import_is_named() -> None:
    refused = pytest.raises(ConfigurationError, match="not a session engine")
    with switching("no.such.engine"), refused:
        SessionStore("a" * 32).load()


def test_until_is_parsed_to_an_aware_datetime() -> None:
    config = build_config({"SESSIONS": {"PREVIOUS_ENGINE": CACHE,
                                        "PREVIOUS_ENGINE_UNTIL": "2030-01-01T00:00:00+00:00"}})
    assert config.feature("SESSIONS")["PREVIOUS_ENGINE_UNTIL"].year == 2030


@pytest.mark.parametrize("mode", ["primary", "read-through"])
def test_previous_cache_down_keeps_the_cookie(mode: str) -> None:
    key = signed_in(CacheStore)
    down = {**settings.CACHES, "down": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }}
    with switching(CACHE, mode), override_settings(CACHES=down, SESSION_CACHE_ALIAS="down"):
        store = SessionStore(key)
        with pytest.raises(SessionStoreUnavailable):
            store.load()
        assert store.session_key == key, "not forgotten: the next request may succeed"
    with switching(CACHE, mode):
        assert SessionStore(key).load()[SESSION_KEY] == "7", "and it does, once it is back"


def test_truncated_record_in_the_previous_db_is_a_miss_and_kept() -> None:
    key = signed_in(DbStore)
    row = Session.objects.get(session_key=key)
    row.session_data = row.session_data[: len(row.session_data) // 2]
    row.save()
    with switching(DB):
        store = SessionStore(key)
        assert store.load() == {}
    assert Session.objects.filter(session_key=key).exists(), "nothing deleted"


def test_undecodable_value_in_the_previous_cache_is_a_miss() -> None:
    key = signed_in(CacheStore)
    cache = caches[settings.SESSION_CACHE_ALIAS]
    raw = cache.client.get_client() if hasattr(cache, "client") else None
    assert raw is not None
    name = cache.make_key(CacheStore(key).cache_key)
    raw.set(name, raw.get(name)[:7], ex=60)
    with switching(CACHE):
        assert SessionStore(key).load() == {}
    assert raw.get(name) is not None, "left as it was"


def test_a_repeated_move_keeps_what_was_written_since() -> None:
    key = signed_in(DbStore)
    with switching(DB):
        first = SessionStore(key)
        assert first.load()["data"] == "kept"
        first["data"] = "changed"
        first.save()
        assert first.session_key == adopted_key(key, "7")
        again = SessionStore(key)  # the same old cookie, once more
        assert again.load()["data"] == "changed"
        assert again.session_key == first.session_key


def test_a_record_of_a_newer_format_is_a_miss_and_left_alone(redis_client: Any) -> None:
    victim, other = SessionStore(), SessionStore()
    victim[SESSION_KEY] = "1"
    victim.save()
    other[SESSION_KEY] = "2"
    other.save()
    assert victim.session_key is not None and other.session_key is not None
    data_key = keys_of(victim.session_key)[0]
    # A newer release's record that still has a ``d``: never read as this format.
    theirs = redis_client.hget(keys_of(other.session_key)[0], "d")
    redis_client.hset(data_key, mapping={"v": "2", "d": theirs})
    store = SessionStore(victim.session_key)
    assert store.load() == {}
    assert store.session_key is None
    assert redis_client.hget(data_key, "v") == b"2", "left as it was"


def test_a_record_without_a_format_version_is_read(redis_client: Any) -> None:
    """Sessions the previous release wrote carry no ``v``: they are this format."""
    store = SessionStore()
    store[SESSION_KEY] = "3"
    store.save()
    assert store.session_key is not None
    redis_client.hdel(keys_of(store.session_key)[0], "v")
    assert SessionStore(store.session_key).load()[SESSION_KEY] == "3"


@requires_django_5  # SessionBase's async API
@pytest.mark.django_db(transaction=True)  # the previous engine is read from another thread
@pytest.mark.parametrize("mode", ["primary", "read-through"])
def test_the_async_api_switches_too(mode: str) -> None:
    key = signed_in(DbStore)

    async def scenario() -> tuple[str | None, str]:
        store = SessionStore(key)
        assert await store.aget("data") == "kept"
        await store.aset("data", "async")
        await store.asave()
        again = SessionStore(store.session_key)
        return store.session_key, await again.aget("data")

    with switching(DB, mode):
        session_key, data = asyncio.run(scenario())
        assert data == "async"
        assert (session_key == key) is (mode == "primary")
        assert len(user_sessions("7")) == 1


def test_switching_on_a_cluster(cluster_settings: str) -> None:
    """The copy, the move and the cutoff each touch one user's slot only."""
    keys = [signed_in(DbStore, user_id) for user_id in ("1", "2", "3")]
    with switching(DB, "primary"):
        for key in keys:
            store = SessionStore(key)
            store["data"] = "copied"
            store.save()
        assert [len(user_sessions(u)) for u in ("1", "2", "3")] == [1, 1, 1]
        revoked = logout_everywhere("2")
        assert (int(revoked), revoked.complete) == (1, False)
        assert SessionStore(keys[1]).load() == {}
    with switching(DB, "read-through"):
        moved = SessionStore(keys[0])
        assert moved.load()["data"] == "copied"
        assert moved.session_key == adopted_key(keys[0], "1")
        assert [len(user_sessions(u)) for u in ("1", "2", "3")] == [1, 0, 1]


@pytest.mark.parametrize("engine", [DB, CACHE])
def test_a_moved_session_that_ended_does_not_come_back_by_the_old_cookie(engine: str) -> None:
    key = signed_in(DbStore if engine == DB else CacheStore)
    with switching(engine):
        moved = SessionStore(key)
        assert moved.load()["data"] == "kept"
        moved.flush()  # a log-out on the moved session
        late = SessionStore(key)  # someone still holding the old cookie
        assert late.load() == {}
        assert late.session_key is None
    old = (DbStore if engine == DB else CacheStore)(key)
    assert SESSION_KEY not in old.load(), "the previous engine keeps no signed-in copy"


def test_concurrent_first_requests_move_a_session_once() -> None:
    """Requests racing with one old cookie (real threads) all land on one moved session."""
    key = signed_in(CacheStore)
    barrier = threading.Barrier(6)
    landed: list[str | None] = []
    errors: list[BaseException] = []

    def request(number: int) -> None:
        try:
            barrier.wait(timeout=30)
            store = SessionStore(key)
            store.load()
            store[f"t{number}"] = True
            store.save()
            landed.append(store.session_key)
        except BaseException as exc:  # reported below, with the thread's own error
            errors.append(exc)

    with switching(CACHE):
        threads = [threading.Thread(target=request, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert set(landed) == {adopted_key(key, "7")}
        moved = SessionStore(adopted_key(key, "7")).load()
        assert moved["data"] == "kept"
        assert any(f"t{n}" in moved for n in range(6))
        assert len(user_sessions("7")) == 1
