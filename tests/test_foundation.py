"""Settings, keys, connections and the Lua loader: the ground every feature stands on."""

from __future__ import annotations

import asyncio
import re

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redispatterns import connection, keys, scripts
from django_redispatterns.conf import build_config, get_config
from django_redispatterns.exceptions import ConfigurationError, RedisPatternsError
from tests.redis_servers import KEY_PREFIX

# --- settings ---------------------------------------------------------------------------


def test_defaults_fill_every_feature() -> None:
    config = build_config({})
    assert config.key_prefix == "rp"
    assert config.feature("LOCKS")["TTL"] == 30
    assert config.feature("IDEMPOTENCY")["METHODS"] == ["POST", "PATCH"]
    assert config.connection_for("LOCKS") == "default"


def test_feature_connection_overrides_top_level() -> None:
    config = build_config({"CONNECTION": "a", "LOCKS": {"CONNECTION": "redis://x:1/0"}})
    assert config.connection_for("LOCKS") == "redis://x:1/0"
    assert config.connection_for("RATELIMIT") == "a"


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"KEY_PERFIX": "x"}, "KEY_PERFIX"),
        ({"LOCKS": {"TLL": 3}}, "TLL"),
        ({"LOCKS": {"TTL": "30"}}, "['LOCKS']['TTL']"),
        ({"RATELIMIT": {"FAIL_OPEN": 1}}, "['RATELIMIT']['FAIL_OPEN']"),
        ({"IDEMPOTENCY": {"TTL": True}}, "['IDEMPOTENCY']['TTL']"),
        ({"IDEMPOTENCY": {"TTL": 0}}, "['IDEMPOTENCY']['TTL']"),
        ({"SESSIONS": []}, "['SESSIONS']"),
        ({"KEY_PREFIX": "a{b}"}, "KEY_PREFIX"),
        ({"SESSIONS": {"IP_STORAGE": "raw"}}, "IP_STORAGE"),
        ("not a dict", "REDIS_PATTERNS"),
    ],
)
def test_bad_settings_raise_improperly_configured_naming_the_key(raw: object, named: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        build_config(raw)
    assert named in str(info.value)
    assert isinstance(info.value, RedisPatternsError)


def test_override_settings_resets_the_cached_config() -> None:
    assert get_config().key_prefix == KEY_PREFIX
    with override_settings(REDIS_PATTERNS={"KEY_PREFIX": "other"}):
        assert get_config().key_prefix == "other"
    assert get_config().key_prefix == KEY_PREFIX


# --- keys -------------------------------------------------------------------------------


def test_identity_hash_is_keyed_stable_and_separated_by_purpose() -> None:
    a = keys.identity_hash("192.0.2.1", purpose="ip")
    assert a == keys.identity_hash("192.0.2.1", purpose="ip")
    assert a != keys.identity_hash("192.0.2.1", purpose="session")
    assert re.fullmatch(r"[0-9a-f]{32}", a)
    import hashlib

    assert a not in hashlib.sha256(b"192.0.2.1").hexdigest()  # not a plain hash
    with override_settings(SECRET_KEY="another-secret"):
        assert keys.identity_hash("192.0.2.1", purpose="ip") != a


def test_make_key_applies_prefix_and_tag() -> None:
    assert keys.make_key("lock", "nightly", tag="locks") == f"{KEY_PREFIX}:lock:{{locks}}:nightly"
    assert keys.make_key("rl", "x") == f"{KEY_PREFIX}:rl:x"
    assert keys.feature_pattern("lock") == f"{KEY_PREFIX}:lock:*"


@pytest.mark.parametrize("bad", ["", "a}b", "{x"])
def test_hash_tag_refuses_user_text(bad: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        keys.hash_tag(bad)


# --- connections ------------------------------------------------------------------------


def test_alias_reuses_django_redis_pool(redis_client: redis.Redis) -> None:
    from django_redis import get_redis_connection

    client = connection.get_client("LOCKS")
    assert client is connection.get_client()
    assert client.connection_pool is get_redis_connection("default").connection_pool
    assert client.ping()


def test_url_client_and_async_client(redis_url: str) -> None:
    with override_settings(REDIS_PATTERNS={"CONNECTION": redis_url, "KEY_PREFIX": KEY_PREFIX}):
        client = connection.get_client("RATELIMIT")
        assert client.ping()
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 1.0

        async def ping() -> bool:
            aclient = connection.get_async_client("RATELIMIT")
            assert aclient is connection.get_async_client("LOCKS")
            ok = await aclient.ping()
            await aclient.aclose()
            return bool(ok)

        assert asyncio.run(ping())


def test_unknown_alias_names_the_problem() -> None:
    with pytest.raises(ConfigurationError, match="neither a URL nor an alias"):
        connection.client_for("nope")
    with pytest.raises(ConfigurationError, match="scheme"):
        connection.client_for("memcached://127.0.0.1:11211")
    with pytest.raises(ConfigurationError, match="service name"):
        connection.client_for("redis+sentinel://127.0.0.1:26379")


def test_unreachable_url_fails_fast() -> None:
    import time

    client = connection.client_for("redis://127.0.0.1:1/0")
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 30  # bounded, not redis-py's retry schedule


# --- Lua --------------------------------------------------------------------------------


def test_every_lua_file_has_a_header_and_loads(redis_client: redis.Redis) -> None:
    for name in scripts.script_names():
        lua = scripts.script(name)
        header = lua.source.decode().splitlines()[:12]
        text = "\n".join(header)
        assert header[0].startswith("--"), f"{name}.lua must open with a header comment"
        for word in ("KEYS", "ARGV", "Returns"):
            assert word in text, f"{name}.lua header must name {word}"
        assert redis_client.script_load(lua.source) == lua.sha


def test_script_survives_script_flush(own_redis: redis.Redis) -> None:
    lua = scripts.LuaScript("echo", b"-- echo: KEYS none, ARGV[1]; Returns ARGV[1]\nreturn ARGV[1]")
    own_redis.script_flush()
    assert lua(own_redis, [], ["a"]) == b"a"  # NOSCRIPT -> EVAL, runs once
    assert own_redis.script_exists(lua.sha)[0]
    assert lua(own_redis, [], ["b"]) == b"b"  # now EVALSHA
    results = scripts.run_many(own_redis, [(lua, [], ["x"]), (lua, [], ["y"])])
    assert results == [b"x", b"y"]
    own_redis.script_flush()
    assert scripts.run_many(own_redis, [(lua, [], ["x"]), (lua, [], ["y"])]) == [b"x", b"y"]


def test_unknown_script_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match="no Lua script named"):
        scripts.LuaScript("does_not_exist")
