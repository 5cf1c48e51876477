"""What one load and one save send, and the shortcuts that keep them cheap.

The save sends ``session_save`` only the arguments that apply (activity fields only when
activity is recorded, a create id only on a create); signatures come from prepared HMAC
states, byte for byte the standard HMAC; Django's JSON serializer is run without its
per-call wrappers, with the same results; a save that failed is never taken for done.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.core import signing
from django.test import override_settings

from django_redispatterns.scripts import LuaScript
from django_redispatterns.sessions import SessionStore, SessionStoreUnavailable, session_handle
from django_redispatterns.sessions.activity import current_activity
from django_redispatterns.sessions.codec import _Hmac, deserialize, serialize
from tests.redis_servers import KEY_PREFIX, RedisServer

pytestmark = pytest.mark.usefixtures("redis_client")


@pytest.mark.parametrize("key_size", [0, 1, 32, 63, 64, 65, 200])
def test_prepared_hmac_states_sign_like_hmac(key_size: int) -> None:
    key = bytes(range(256))[:key_size]
    for value in (b"", b"a", b"x" * 63, b"y" * 64, b"z" * 1000):
        expected = base64.urlsafe_b64encode(hmac.digest(key, value, "sha256")).rstrip(b"=")
        prepared = _Hmac(key)
        assert prepared.b64_signature(value) == expected
        assert prepared.b64_signature(value) == expected  # its states are copied, not used up


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    """(script name, args) of every script call the engine makes (the calls still run)."""
    calls: list[tuple[str, list[Any]]] = []
    original = LuaScript.__call__

    def spy(self: LuaScript, client: Any, keys: Any = (), args: Any = ()) -> Any:
        calls.append((self.name, list(args)))
        return original(self, client, keys, args)

    monkeypatch.setattr(LuaScript, "__call__", spy)
    return calls


def data_key(session_key: str) -> str:
    return f"{KEY_PREFIX}:sess:{{{session_key[:32]}}}:s:{session_handle(session_key)}"


def test_a_save_sends_only_the_arguments_that_apply(sent: list[tuple[str, list[Any]]],
                                                    redis_client: redis.Redis) -> None:
    store = SessionStore()
    store[SESSION_KEY] = "7"
    store.save()  # a create, no activity: flags, data, TTL, cap, create id
    assert [len(args) for _, args in sent] == [5]
    assert sent[0][1][0] == "c1"
    key = store.session_key
    assert key is not None

    again = SessionStore(key)
    again["n"] = 1
    again.save()  # an update, no activity: flags, data, TTL, cap
    assert sent[1][1][0] == "u1" and len(sent[1][1]) == 4

    token = current_activity.set(("203.0.113.9", "agent/1"))
    try:
        third = SessionStore(key)
        third["n"] = 2
        third.save()  # activity due (never recorded): its two fields follow
    finally:
        current_activity.reset(token)
    assert sent[2][1][0] == "u1a" and sent[2][1][4:] == ["203.0.113.9", "agent/1"]
    stored = redis_client.hgetall(data_key(key))
    assert stored[b"ip"] == b"203.0.113.9" and stored[b"ua"] == b"agent/1"
    assert int(stored[b"a"]) > 0 and b"n" in stored
    assert SessionStore(key).load()["n"] == 2
    SessionStore(key).delete()


@pytest.fixture
def own_server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    node = redis_server_factory()
    config = {**settings.REDIS_PATTERNS, "SOCKET_TIMEOUT": 1, "SESSIONS": {"CONNECTION": node.url}}
    with override_settings(REDIS_PATTERNS=config):
        yield node


def test_a_save_that_failed_is_sent_again(own_server: RedisServer) -> None:
    """The "already saved" shortcut only remembers saves that succeeded."""
    admin = own_server.client()
    store = SessionStore()
    store[SESSION_KEY] = "8"
    store.save()
    key = store.session_key
    assert key is not None
    store["cart"] = [1]
    admin.replicaof("127.0.0.1", "1")  # a demoted primary: writes refused with READONLY
    try:
        with pytest.raises(SessionStoreUnavailable):
            store.save()
    finally:
        admin.replicaof("no", "one")
    store.save()  # the same state: written now
    assert SessionStore(key).load()["cart"] == [1]
    assert admin.pttl(data_key(key)) > 0


class CountingSerializer(signing.JSONSerializer):
    calls = 0

    def loads(self, data: bytes) -> Any:
        CountingSerializer.calls += 1
        return super().loads(data)


@pytest.mark.parametrize("data", [b'{"a":[1,"\\u00e9"],"b":null}', b"{}", b' {"a":1} ',
                                  b'{"a":1}\n', b'{"a":1}x', b"", b"[1]", b"\xff", b'"x'])
def test_the_json_shortcut_decodes_like_djangos_serializer(data: bytes) -> None:
    try:
        expected: Any = signing.JSONSerializer().loads(data)
    except ValueError as exc:
        expected = type(exc)
    try:
        got: Any = deserialize(signing.JSONSerializer, data)
    except ValueError as exc:
        got = type(exc)
    assert got == expected


def test_the_json_shortcut_encodes_like_djangos_serializer() -> None:
    value = {"a": [1, 2.5, "é", None, True], "b": {"c": "x" * 300}}
    assert serialize(signing.JSONSerializer, value) == signing.JSONSerializer().dumps(value)


def test_another_serializer_is_used_as_configured() -> None:
    """A subclass (or any other serializer) goes through its own methods."""
    before = CountingSerializer.calls
    assert deserialize(CountingSerializer, b'{"a":1}') == {"a": 1}
    with override_settings(SESSION_SERIALIZER="tests.test_sessions_wire.CountingSerializer"):
        store = SessionStore()
        store["a"] = 2
        store.save()
        assert SessionStore(store.session_key).load() == {"a": 2}
        store.delete()
    assert CountingSerializer.calls == before + 2
