"""The SessionBase contract, checked the way Django's own session backend tests check it.

Django does not ship its ``tests/sessions_tests`` with the package, so this is our own
equivalent of ``SessionTestsMixin`` (same behaviours, our words), plus what the Redis
engine promises on top: TTLs, strict keys, no resurrection, corrupt data, hashed ids.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import pickle
import tempfile
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.sessions.backends.base import CreateError, UpdateError
from django.core import signing
from django.test import override_settings
from django.utils import timezone

from django_redispatterns import scripts
from django_redispatterns.sessions import KEY_RE, SessionStore, session_handle, user_tag
from tests.compat import requires_django_5
from tests.redis_servers import KEY_PREFIX

pytestmark = pytest.mark.usefixtures("redis_client")


def data_key(session_key: str | None) -> str:
    assert session_key is not None
    return f"{KEY_PREFIX}:sess:{{{session_key[:32]}}}:s:{session_handle(session_key)}"


def all_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match=f"{KEY_PREFIX}:sess:*", count=1000))


@pytest.fixture
def session() -> Any:
    store = SessionStore()
    yield store
    store.delete()


# --- the dict-like surface ------------------------------------------------------------


def test_new_session_is_neither_modified_nor_accessed(session: SessionStore) -> None:
    assert session.modified is False
    assert session.accessed is False
    assert session.get("cat") is None


def test_store_pop_setdefault_update_and_clear(session: SessionStore) -> None:
    session["cat"] = "dog"
    assert session.modified is True
    assert session.pop("cat") == "dog"
    assert session.pop("cat", "gone") == "gone"
    with pytest.raises(KeyError):
        session.pop("cat")
    assert session.setdefault("foo", "bar") == "bar"
    assert session.setdefault("foo", "baz") == "bar"
    session.update({"n": 1})
    assert session.get("n") == 1
    session.modified = session.accessed = False
    assert "n" in session and session.accessed and not session.modified
    assert sorted(session.keys()) == ["foo", "n"]
    assert sorted(session.values(), key=str) == [1, "bar"]
    session.clear()
    assert list(session.items()) == []
    assert session.modified and session.accessed


def test_pop_of_missing_key_with_default_does_not_modify(session: SessionStore) -> None:
    assert session.pop("nope", "default") == "default"
    assert session.accessed is True
    assert session.modified is False


def test_session_key_is_read_only(session: SessionStore) -> None:
    with pytest.raises(AttributeError):
        session.session_key = "x" * 64  # type: ignore[misc]


@pytest.mark.parametrize("key", ["", "1", "1234567"])
def test_too_short_keys_are_invalid(key: str) -> None:
    assert SessionStore(key).session_key is None


def test_keys_of_eight_characters_are_accepted_like_django() -> None:
    store = SessionStore()
    store._session_key = "12345678"
    assert store.session_key == "12345678"


# --- persistence ----------------------------------------------------------------------


def test_save_exists_load_delete(session: SessionStore, redis_client: redis.Redis) -> None:
    session["a"] = "b"
    session.save()
    key = session.session_key
    assert key is not None and KEY_RE.fullmatch(key)
    assert session.exists(key) is True
    assert SessionStore(key).load() == {"a": "b"}
    session.delete(key)
    assert session.exists(key) is False
    assert redis_client.exists(data_key(key)) == 0


def test_save_does_not_clear_data(session: SessionStore) -> None:
    session["a"] = "b"
    session.save()
    assert session["a"] == "b"


def test_empty_session_round_trips(session: SessionStore) -> None:
    session.save()
    loaded = SessionStore(session.session_key)
    assert loaded.load() == {}
    assert loaded.session_key == session.session_key  # an empty session is not "corrupt"


def test_flush_deletes_and_forgets_the_key(session: SessionStore) -> None:
    session["foo"] = "bar"
    session.save()
    previous = session.session_key
    session.flush()
    assert session.exists(previous) is False
    assert session.session_key is None
    assert session.modified and session.accessed


def test_cycle_key_keeps_data_under_a_new_key(session: SessionStore) -> None:
    session["a"], session["b"] = "c", "d"
    session.save()
    previous = session.session_key
    items = list(session.items())
    session.cycle_key()
    assert session.session_key != previous
    assert session.exists(previous) is False
    assert list(session.items()) == items
    assert SessionStore(session.session_key).load() == dict(items)


def test_cycle_key_of_a_session_never_loaded_keeps_its_data(session: SessionStore) -> None:
    session["a"] = "b"
    session.save()
    fresh = SessionStore(session.session_key)
    fresh.cycle_key()
    assert fresh.session_key != session.session_key
    assert fresh["a"] == "b"


def test_invalid_key_is_replaced_on_save() -> None:
    for bad in ("1", "12345678", "attackerchosen123"):
        store = SessionStore(bad)
        store["x"] = 1
        store.save()
        assert store.session_key != bad
        assert store.session_key is not None and KEY_RE.fullmatch(store.session_key)
        store.delete()


def test_load_of_an_unknown_key_creates_nothing(redis_client: redis.Redis) -> None:
    unknown = "0" * 32 + "a" * 32
    store = SessionStore(unknown)
    assert store.load() == {}
    assert store.session_key is None
    assert store.exists(unknown) is False
    assert all_keys(redis_client) == []


def test_must_create_on_an_existing_key_raises_create_error(session: SessionStore) -> None:
    session["a"] = 1
    session.save()
    other = SessionStore(session.session_key)
    other["b"] = 2
    with pytest.raises(CreateError):
        other.save(must_create=True)
    assert SessionStore(session.session_key).load() == {"a": 1}


def test_save_does_not_resurrect_a_session_deleted_elsewhere(redis_client: redis.Redis) -> None:
    first = SessionStore()
    first["data"] = "one"
    first.save(must_create=True)
    SessionStore(first.session_key).delete()
    first["data"] = "two"
    with pytest.raises(UpdateError):
        first.save()
    assert first.exists(first.session_key) is False
    assert all_keys(redis_client) == []


def test_a_retried_create_succeeds_once(redis_client: redis.Redis) -> None:
    """redis-py re-sends a timed-out call; the create must not then fail."""
    store = SessionStore()
    key = store._get_new_session_key()
    keys = [data_key(key), f"{KEY_PREFIX}:sess:{{{key[:32]}}}:u"]
    args: list[str | int] = ["c0", store.encode({}), 60_000, 0, "req-1"]
    save = scripts.script("session_save")
    assert save(redis_client, keys, args) == 1
    assert save(redis_client, keys, args) == 1  # the retry finds its own key
    assert save(redis_client, keys, [*args[:4], "req-2"]) == 0  # a real collision


def test_clear_expired_is_a_no_op() -> None:
    assert SessionStore.clear_expired() is None


@requires_django_5
def test_async_api(redis_client: redis.Redis) -> None:
    async def scenario() -> dict[str, Any]:
        store = SessionStore()
        await store.aset("a", 1)
        await store.asave()
        loaded = SessionStore(store.session_key)
        exists = await loaded.aexists(store.session_key or "")
        result = {"a": await loaded.aget("a"), "exists": exists}
        await loaded.adelete()
        return result

    assert asyncio.run(scenario()) == {"a": 1, "exists": True}


# --- expiry ---------------------------------------------------------------------------


def test_default_expiry(session: SessionStore) -> None:
    assert session.get_expiry_age() == settings.SESSION_COOKIE_AGE
    session.set_expiry(0)
    assert session.get_expiry_age() == settings.SESSION_COOKIE_AGE


@pytest.mark.parametrize("kind", ["seconds", "timedelta", "datetime"])
def test_custom_expiry(session: SessionStore, kind: str) -> None:
    now = timezone.now()
    value: Any = {"seconds": 10, "timedelta": timedelta(seconds=10),
                  "datetime": now + timedelta(seconds=10)}[kind]
    session.set_expiry(value)
    age = session.get_expiry_age(modification=now)
    assert 9 <= age <= 10
    assert abs((session.get_expiry_date(modification=now) - now).total_seconds() - 10) < 1.5


def test_expiry_reset_and_browser_close(session: SessionStore) -> None:
    session.set_expiry(10)
    session.set_expiry(None)
    assert session.get_expiry_age() == settings.SESSION_COOKIE_AGE
    with override_settings(SESSION_EXPIRE_AT_BROWSER_CLOSE=False):
        session.set_expiry(10)
        assert session.get_expire_at_browser_close() is False
        session.set_expiry(0)
        assert session.get_expire_at_browser_close() is True
        session.set_expiry(None)
        assert session.get_expire_at_browser_close() is False
    with override_settings(SESSION_EXPIRE_AT_BROWSER_CLOSE=True):
        session.set_expiry(None)
        assert session.get_expire_at_browser_close() is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (300, 300),
        (timedelta(seconds=600), 600),
        ("datetime", 900),
        (0, None),  # browser close: the key lives SESSION_COOKIE_AGE
        (None, None),
    ],
)
def test_redis_ttl_is_the_expiry_age(redis_client: redis.Redis, value: Any,
                                     expected: int | None) -> None:
    store = SessionStore()
    if value == "datetime":
        value = timezone.now() + timedelta(seconds=900)
    store.set_expiry(value)
    store["x"] = 1
    store.save()
    expected = expected or settings.SESSION_COOKIE_AGE
    pttl = redis_client.pttl(data_key(store.session_key))
    assert expected * 1000 - 3000 <= pttl <= expected * 1000
    # the expiry survives the JSON round trip
    assert abs(SessionStore(store.session_key).get_expiry_age() - expected) <= 3
    store.delete()


def test_a_session_expired_in_the_past_cannot_be_loaded(redis_client: redis.Redis) -> None:
    store = SessionStore()
    store["foo"] = "bar"
    store.set_expiry(-timedelta(seconds=10))
    store.save()
    fresh = SessionStore(store.session_key)
    assert "foo" not in fresh
    assert all_keys(redis_client) == []


def test_expiry_is_enforced_by_redis(redis_client: redis.Redis) -> None:
    store = SessionStore()
    store.set_expiry(1)
    store["a"] = 1
    store.save()
    redis_client.pexpire(data_key(store.session_key), 20)  # instead of waiting a second
    time.sleep(0.1)
    assert SessionStore(store.session_key).load() == {}


# --- serializer and corrupt data ---------------------------------------------------------


def test_data_is_signed_json_never_pickle(session: SessionStore,
                                          redis_client: redis.Redis) -> None:
    session["a"] = [1, "two"]
    session.save()
    raw = redis_client.hget(data_key(session.session_key), "d")
    assert isinstance(raw, bytes) and not raw.startswith(b"\x80")
    assert signing.loads(raw.decode(), salt=session.key_salt,
                         serializer=signing.JSONSerializer) == {"a": [1, "two"]}


def test_encode_decode_round_trip(session: SessionStore) -> None:
    data = {"a test key": "a test value"}
    assert session.decode(session.encode(data)) == data


def test_decode_failure_is_logged_to_security(session: SessionStore,
                                              caplog: pytest.LogCaptureFixture) -> None:
    bad = base64.b64encode(b"flaskdj:alkdjf").decode()
    with caplog.at_level(logging.WARNING, logger="django.security.SuspiciousSession"):
        assert session.decode(bad) == {}
    assert "corrupted" in caplog.text


def _pickle_bomb(marker: str) -> bytes:
    class Bomb:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (marker, "w"))

    return pickle.dumps(Bomb())


@pytest.mark.parametrize("kind", ["random", "truncated", "bad-signature", "pickle",
                                  "json-list", "wrong-type", "no-data-field"])
def test_corrupt_data_gives_an_empty_session_under_a_new_key(
    kind: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore()
    store["user"] = "alice"
    store.save()
    key = store.session_key
    dkey = data_key(key)
    marker = os.path.join(tempfile.mkdtemp(), "pwned")
    good = redis_client.hget(dkey, "d")
    assert good is not None
    payload = {
        "random": os.urandom(64),
        "truncated": good[: len(good) // 2],
        "bad-signature": signing.dumps({"user": "mallory"}, salt="another salt"),
        "pickle": _pickle_bomb(marker),
        "json-list": store.encode([1, 2]),  # type: ignore[arg-type]
    }.get(kind)
    if kind == "wrong-type":
        redis_client.delete(dkey)
        redis_client.set(dkey, b"not a hash", ex=60)
    elif kind == "no-data-field":
        redis_client.hdel(dkey, "d")
    else:
        redis_client.hset(dkey, "d", payload)
    with caplog.at_level(logging.WARNING, logger="django.security.SuspiciousSession"):
        fresh = SessionStore(key)
        assert fresh.load() == {}
        assert fresh.session_key is None
    assert not os.path.exists(marker)
    fresh["x"] = 1
    fresh.save()
    assert fresh.session_key != key  # the corrupt key is never reused
    if kind not in ("no-data-field",):
        assert "Session data" in caplog.text
    redis_client.delete(dkey)
    fresh.delete()


# --- key names -------------------------------------------------------------------------


def test_redis_never_holds_the_cookie_value(redis_client: redis.Redis) -> None:
    store = SessionStore()
    store["_auth_user_id"] = "42"
    store.save()
    key = store.session_key
    assert key is not None and key.startswith(user_tag("42"))
    for name in all_keys(redis_client):
        assert key.encode() not in name
        if redis_client.type(name) == b"zset":
            members = [m for m, _ in redis_client.zscan_iter(name)]
            assert key.encode() not in members
        else:
            assert all(key.encode() not in v for v in redis_client.hvals(name))
    store.delete()


# --- signing: Django's format, both ways ---------------------------------------------------


@pytest.mark.parametrize("payload", [{}, {"a": 1}, {"big": "x" * 5000, "n": list(range(50))}])
def test_our_encoding_is_djangos_signing_format_both_ways(payload: dict[str, Any]) -> None:
    store = SessionStore()
    ours = store.encode(payload)
    assert signing.loads(ours, salt=store.key_salt, serializer=store.serializer) == payload
    djangos = signing.dumps(payload, salt=store.key_salt, serializer=store.serializer,
                            compress=True)
    assert store.decode(djangos) == payload
    if len(str(payload)) > 1000:
        assert ours.startswith(".")  # large sessions are compressed


def test_tampering_and_other_salts_are_rejected(caplog: pytest.LogCaptureFixture) -> None:
    store = SessionStore()
    good = store.encode({"user": "alice"})
    payload, ts, sig = good.split(":")
    forged_payload = signing.b64_encode(b'{"user":"mallory"}').decode()
    for bad in (f"{forged_payload}:{ts}:{sig}", f"{payload}:{ts}:{sig[:-2]}AA", payload,
                signing.dumps({"user": "alice"}, salt="other.salt", compress=True), ""):
        assert store.decode(bad) == {}
    assert "corrupted" in caplog.text


def test_secret_key_fallbacks_still_verify() -> None:
    with override_settings(SECRET_KEY="old-secret-old-secret-old-secret-old-secret-old"):
        old = SessionStore().encode({"a": 1})
    with override_settings(SECRET_KEY="new-secret-new-secret-new-secret-new-secret-new",
                           SECRET_KEY_FALLBACKS=["old-secret-old-secret-old-secret-old-secret-old"]):
        assert SessionStore().decode(old) == {"a": 1}
    with override_settings(SECRET_KEY="new-secret-new-secret-new-secret-new-secret-new"):
        assert SessionStore().decode(old) == {}


# --- round trips ------------------------------------------------------------------------------


def round_trips(fn: Any) -> int:
    """How many times ``fn`` takes a connection from the engine's pool (= round trips)."""
    from django_redispatterns import connection

    pool = connection.get_client("SESSIONS").connection_pool
    original = pool.get_connection
    calls = 0

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    pool.get_connection = counting
    try:
        fn()
    finally:
        del pool.get_connection
    return calls


def test_load_and_save_are_one_round_trip_each_including_the_index() -> None:
    from django_redispatterns.sessions import user_sessions

    store = SessionStore()
    store["_auth_user_id"] = "5"
    assert round_trips(store.save) == 1  # create, indexed
    key = store.session_key
    again = SessionStore(key)
    assert round_trips(lambda: again["_auth_user_id"]) == 1  # load
    again["n"] = 1
    assert round_trips(again.save) == 1  # update + index
    assert round_trips(lambda: again.exists(key)) == 1
    assert round_trips(again.cycle_key) == 2  # create the new key, delete the old
    assert [s.is_current for s in user_sessions("5", current=again.session_key)] == [True]
    assert round_trips(again.delete) == 1


# --- races (regressions of django-redis-sessions and Django's cache engine) ------------------


def test_concurrent_creates_of_one_key_let_exactly_one_win() -> None:
    """django-redis-sessions checks exists() then SETEX: two creates can both 'succeed'."""
    import threading

    key = SessionStore()._get_new_session_key()
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create(i: int) -> None:
        store = SessionStore(key)
        store._session_cache = {"writer": i}  # type: ignore[attr-defined]
        barrier.wait()
        try:
            store.save(must_create=True)
            outcomes.append("created")
        except CreateError:
            outcomes.append("collision")

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["collision"] * 7 + ["created"]
    SessionStore(key).delete()


def test_saves_racing_a_delete_never_bring_the_session_back(redis_client: redis.Redis) -> None:
    """Django's cache engine GETs then SETs: a save landing after a delete resurrects."""
    import threading

    first = SessionStore()
    first["n"] = 0
    first.save()
    key = first.session_key
    deleted = threading.Event()
    late_saves: list[str] = []

    def keep_saving() -> None:
        for n in range(300):
            store = SessionStore(key)
            if store.get("n") is None:  # loaded after the delete: nothing to save
                return
            store["n"] = n
            was_deleted = deleted.is_set()
            try:
                store.save()
                if was_deleted:
                    late_saves.append("saved after the delete")
            except UpdateError:
                pass

    threads = [threading.Thread(target=keep_saving) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    SessionStore().delete(key)
    deleted.set()
    for t in threads:
        t.join(30)
    assert late_saves == []
    assert SessionStore().exists(key) is False
    assert all_keys(redis_client) == []


@requires_django_5
def test_native_async_engine(redis_client: redis.Redis) -> None:
    """aload/asave/aexists/adelete/acreate/acycle_key/aflush run on redis.asyncio."""

    async def scenario() -> None:
        store = SessionStore()
        await store.aset("a", 1)
        await store.asave()
        key = store.session_key
        assert await SessionStore(key).aload() == {"a": 1}
        assert await store.aexists(key) is True
        intruder = SessionStore(key)
        intruder._session_cache = {"b": 2}  # type: ignore[attr-defined]
        with pytest.raises(CreateError):
            await intruder.asave(must_create=True)
        await store.aset("_auth_user_id", "9")
        await store.asave()  # moves to user 9's tag, through arun_many
        assert store.session_key is not None and store.session_key.startswith(user_tag("9"))
        assert await store.aexists(key) is False
        before_cycle = store.session_key
        await store.acycle_key()
        assert store.session_key != before_cycle and not await store.aexists(before_cycle)
        stale = SessionStore(store.session_key)
        assert await stale.aget("a") == 1
        await SessionStore().adelete(store.session_key)
        await stale.aset("a", 2)
        with pytest.raises(UpdateError):
            await stale.asave()
        await store.aflush()
        assert store.session_key is None
        assert await SessionStore("0" * 32 + "a" * 32).aload() == {}
        await SessionStore.aclear_expired()

    asyncio.run(scenario())
    for name in all_keys(redis_client):  # only the move's short-lived tombstone is left
        assert list(redis_client.hkeys(name)) == [b"x"] and 0 < redis_client.pttl(name) <= 60_000
