"""The session engine on a real 3-master Redis Cluster: no CROSSSLOT, index still exact.

Users' sessions live on different slots (and masters); every script a session runs touches
keys of one hash tag only, and a session moving to another user's tag is a pipeline the
cluster client splits per node.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.sessions.backends.base import UpdateError
from django.test import Client, override_settings

from django_redispatterns.sessions import (
    SessionStore,
    logout_everywhere,
    revoke_session,
    user_sessions,
)
from tests.compat import requires_django_5

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls_sessions")]


def test_session_lifecycle_on_cluster(cluster_settings: str) -> None:
    store = SessionStore()
    store["cart"] = [1, 2]
    store.save()
    anonymous_key = store.session_key
    assert SessionStore(anonymous_key).load() == {"cart": [1, 2]}
    store[SESSION_KEY] = "7"
    store.save()  # moves to user 7's slot
    assert store.session_key != anonymous_key
    assert SessionStore().exists(anonymous_key) is False
    store.cycle_key()
    assert [s.is_current for s in user_sessions(7, current=store.session_key)] == [True]
    other = SessionStore(store.session_key)
    assert other.get("cart") == [1, 2]  # loaded and cached
    SessionStore().delete(store.session_key)
    other["cart"] = []
    with pytest.raises(UpdateError):
        other.save()
    assert user_sessions(7) == []


def test_many_users_spread_over_slots_and_log_out_everywhere(cluster_settings: str) -> None:
    stores: dict[int, list[SessionStore]] = {}
    for user_id in range(12):
        for _ in range(5):
            store = SessionStore()
            store[SESSION_KEY] = str(user_id)
            store.save()
            stores.setdefault(user_id, []).append(store)
    tags = {stores[u][0].session_key[:32] for u in stores}  # type: ignore[index]
    assert len(tags) == 12
    for user_id, own in stores.items():
        assert len(user_sessions(user_id)) == 5
        keep = own[0].session_key
        assert logout_everywhere(user_id, keep=keep) == 4
        assert [s.is_current for s in user_sessions(user_id, current=keep)] == [True]
        assert revoke_session(user_id, keep or "") is True
        assert user_sessions(user_id) == []


def test_login_and_logout_through_requests_on_cluster(cluster_settings: str) -> None:
    user: Any = get_user_model().objects.create_user(username="carol", password="pw")
    middleware = [
        "django_redispatterns.middleware.SessionActivityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions",
                           MIDDLEWARE=middleware):
        devices = [Client(HTTP_USER_AGENT=f"ua{i}") for i in range(3)]
        for d in devices:
            d.get("/write/x/")
            assert d.post("/login/", {"username": "carol", "password": "pw"}).status_code == 200
        assert {s.user_agent for s in user_sessions(user)} == {"ua0", "ua1", "ua2"}
        assert devices[0].post("/everywhere-else/").json() == {"revoked": 2}
        assert devices[1].get("/whoami/").json()["user"] is None
        assert devices[0].get("/whoami/").json() == {"user": "carol", "data": "x"}


@requires_django_5
def test_native_async_engine_on_cluster(cluster_settings: str) -> None:
    import asyncio

    async def scenario() -> None:
        store = SessionStore()
        await store.aset("cart", [1])
        await store.asave()
        anonymous_key = store.session_key
        await store.aset(SESSION_KEY, "11")
        await store.asave()  # the move: a pipeline over two slots
        assert not await store.aexists(anonymous_key)
        assert await SessionStore(store.session_key).aload() == {"cart": [1], SESSION_KEY: "11"}
        await store.acycle_key()
        await store.adelete()

    asyncio.run(scenario())
    assert user_sessions(11) == []


def test_the_per_user_cap_ends_the_oldest_sessions_on_cluster(cluster_settings: str) -> None:
    from django.conf import settings

    sessions = {**settings.REDIS_PATTERNS.get("SESSIONS", {}), "MAX_PER_USER": 3}
    with override_settings(REDIS_PATTERNS={**settings.REDIS_PATTERNS, "SESSIONS": sessions}):
        keys = []
        for n in range(5):
            store = SessionStore()
            store[SESSION_KEY] = "41"
            store.set_expiry(600 + 60 * n)
            store.save()
            keys.append(store.session_key)
        assert [SessionStore(k).get(SESSION_KEY) for k in keys] == [None, None, "41", "41", "41"]
        assert len(user_sessions(41)) == 3
        assert logout_everywhere(41) == 3
