"""SESSIONS["MAX_PER_USER"]: a sign-in beyond the cap ends the user's oldest sessions.

"Oldest" is the index order: the sessions that expire first. The cap holds under concurrent
sign-ins (the eviction runs inside the save script), and ``user_sessions()`` never reads or
returns more than the cap, even for an index written before the cap existed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import SESSION_KEY
from django.test import override_settings

from django_redispatterns import scripts
from django_redispatterns.conf import build_config
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.sessions import SessionStore, session_handle, user_sessions, user_tag
from tests.redis_servers import KEY_PREFIX
from tests.test_sessions_index import assert_index_exact, indexed, live_data_keys, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]


def _config(cap: int) -> dict[str, Any]:
    return {"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX, "SESSIONS": {"MAX_PER_USER": cap}}


@pytest.fixture(autouse=True)
def _engine() -> Iterator[None]:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        yield


def sign_in(user_id: Any, *, expiry: int | None = None) -> str:
    store = SessionStore()
    store[SESSION_KEY] = str(user_id)
    if expiry is not None:
        store.set_expiry(expiry)
    store.save()
    assert store.session_key is not None
    return store.session_key


def is_live(session_key: str) -> bool:
    return SessionStore(session_key).get(SESSION_KEY) is not None


@pytest.mark.parametrize("value", [0, -1, True, "10", 2.5, None])
def test_max_per_user_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="MAX_PER_USER"):
        build_config({"SESSIONS": {"MAX_PER_USER": value}})


def test_the_default_cap_is_100() -> None:
    assert build_config({}).feature("SESSIONS")["MAX_PER_USER"] == 100


def test_a_sign_in_beyond_the_cap_ends_the_oldest_sessions(redis_client: redis.Redis) -> None:
    user = make_user()
    with override_settings(REDIS_PATTERNS=_config(3)):
        keys = [sign_in(user.pk, expiry=600 + 60 * n) for n in range(5)]  # oldest first
        assert [is_live(k) for k in keys] == [False, False, True, True, True]
        assert indexed(redis_client, user) == {session_handle(k) for k in keys[2:]}
        assert_index_exact(redis_client, user)
        assert {s.session_key for s in user_sessions(user)} == {session_handle(k)
                                                                 for k in keys[2:]}


def test_the_session_signing_in_is_never_the_one_ended(redis_client: redis.Redis) -> None:
    user = make_user()
    with override_settings(REDIS_PATTERNS=_config(2)):
        long_lived = [sign_in(user.pk, expiry=3600) for _ in range(2)]
        short = sign_in(user.pk, expiry=120)  # expires first, but it is the one signing in
        assert is_live(short)
        assert sum(is_live(k) for k in long_lived) == 1
        assert_index_exact(redis_client, user)


def test_other_users_are_not_affected(redis_client: redis.Redis) -> None:
    alice, bob = make_user(), make_user("bob")
    with override_settings(REDIS_PATTERNS=_config(2)):
        bobs = [sign_in(bob.pk) for _ in range(2)]
        for _ in range(5):
            sign_in(alice.pk)
        assert all(is_live(k) for k in bobs)
        assert len(indexed(redis_client, alice)) == 2


def test_concurrent_sign_ins_never_leave_more_than_the_cap(redis_client: redis.Redis) -> None:
    user = make_user()
    cap, errors = 5, []

    def sign_in_repeatedly() -> None:
        try:
            for _ in range(15):
                sign_in(user.pk)
        except Exception as exc:  # reported below
            errors.append(exc)

    with override_settings(REDIS_PATTERNS=_config(cap)):
        threads = [threading.Thread(target=sign_in_repeatedly) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(indexed(redis_client, user)) == cap
        assert len(live_data_keys(redis_client, user)) == cap
        assert_index_exact(redis_client, user)
        assert len(user_sessions(user)) == cap


def test_user_sessions_never_returns_more_than_the_cap_for_an_older_index(
    redis_client: redis.Redis,
) -> None:
    """An index filled before the cap (or before it was lowered) is listed up to the cap."""
    user = make_user()
    tag = user_tag(str(user.pk))
    encoded = SessionStore().encode({SESSION_KEY: str(user.pk)})
    save = scripts.script("session_save")
    calls: list[scripts.Call] = [
        (save, [f"{KEY_PREFIX}:sess:{{{tag}}}:s:{n:032x}", f"{KEY_PREFIX}:sess:{{{tag}}}:u"],
         ["c1", encoded, 600_000 + n * 1000, 0, f"n{n}"])
        for n in range(244)  # no cap: as written by a version without one, or before it was set
    ]
    assert scripts.run_many(redis_client, calls) == [1] * 244
    with override_settings(REDIS_PATTERNS=_config(10)):
        listed = user_sessions(user)
        assert len(listed) == 10
        # the latest-expiring ones
        assert {s.session_key for s in listed} == {f"{n:032x}" for n in range(234, 244)}
        # the next sign-in ends at most 100 of the surplus in its one call (bounded work)
        sign_in(user.pk)
        assert len(indexed(redis_client, user)) == 245 - 100
        assert len(user_sessions(user)) == 10
