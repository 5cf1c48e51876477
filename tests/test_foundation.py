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


# --- layering and settings resets -------------------------------------------------------


def _package_imports(module_file: str) -> set[str]:
    """Modules of the package that ``module_file`` imports, wherever the import stands."""
    import ast
    from pathlib import Path

    import django_redispatterns

    root = Path(django_redispatterns.__file__).parent
    found: set[str] = set()
    for node in ast.walk(ast.parse((root / module_file).read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.update(f"{node.module or ''}.{a.name}".strip(".") for a in node.names)
            if node.module:
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "django_redispatterns"):
            found.add(node.module or "")
    return found


def test_settings_import_nothing_above_them() -> None:
    """conf is read by the foundation; it must not reach up into clients or keys."""
    imported = {name.split(".")[-1] for name in _package_imports("conf.py")}
    assert not imported & {"connection", "keys", "scripts"}, imported


def test_the_deploy_checks_use_connections_public_url_helpers() -> None:
    imported = _package_imports("checks/targets.py")
    assert not {name for name in imported if name.rsplit(".", 1)[-1].startswith("_")}, imported


def test_override_settings_resets_clients_config_and_secret(redis_url: str) -> None:
    before_client = connection.client_for(redis_url)
    before_hash = keys.identity_hash("x")
    with override_settings(SECRET_KEY="another-secret-for-this-test"):
        assert keys.identity_hash("x") != before_hash
        assert connection.client_for(redis_url) is not before_client
    assert keys.identity_hash("x") == before_hash
    with override_settings(REDIS_PATTERNS={"KEY_PREFIX": KEY_PREFIX, "SOCKET_TIMEOUT": 0.25}):
        client = connection.client_for(redis_url)
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.25
    assert connection.client_for(redis_url).connection_pool.connection_kwargs[
        "socket_timeout"] == 1.0


# --- URLs: parsing and redaction ----------------------------------------------------------


def test_parse_url_reads_hosts_credentials_service_and_db() -> None:
    parsed = connection.parse_url(
        "redis+sentinel://us%40r:p%3Ass@10.0.0.1:26380,10.0.0.2/mymaster/3?sentinel_password=s")
    assert parsed.scheme == "redis+sentinel"
    assert parsed.hosts == (("10.0.0.1", 26380), ("10.0.0.2", 26379))
    assert parsed.credentials == {"username": "us@r", "password": "p:ss"}
    assert parsed.path == ("mymaster", "3")
    assert parsed.query == {"sentinel_password": "s"}
    cluster = connection.parse_url("redis+cluster://a:1,b")
    assert cluster.hosts == (("a", 1), ("b", 6379)) and cluster.credentials == {}


@pytest.mark.parametrize(("url", "secret"), [
    ("redis://:hunter2@127.0.0.1:6379/0", "hunter2"),
    ("redis://alice:hunter2@127.0.0.1:6379/0", "hunter2"),
    ("rediss://alice:hun@ter2@cache.example:6380/1", "hun@ter2"),  # an unencoded '@'
    ("redis+sentinel://:hunter2@h1:26379,h2:26379/svc/0?sentinel_password=s3cret", "s3cret"),
    ("redis+sentinel://:hunter2@h1:26379/svc?sentinel_password=s3cret", "hunter2"),
    ("unix:///tmp/redis.sock?db=0&password=hunter2", "hunter2"),
    ("redis://h:6379/0?password=hunter2", "hunter2"),
])
def test_redact_hides_every_password(url: str, secret: str) -> None:
    shown = connection.redact(url)
    assert secret not in shown and "***" in shown
    assert "@" not in shown or shown.split("://", 1)[1].count("@") <= 1
    # the rest stays readable: scheme and host are still there
    assert shown.split("://")[0] == url.split("://")[0]
    text = f"Error connecting to {url}: refused"
    assert secret not in connection.redact_text(text)
    assert connection.redact_text(text).endswith(": refused")


def test_redact_leaves_password_free_urls_alone() -> None:
    for url in ("redis://127.0.0.1:6379/0", "redis://alice@h:1/0", "default",
                "redis+cluster://a:1,b:2"):
        assert connection.redact(url) == url


def test_an_unsupported_scheme_error_names_the_url_without_its_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        connection.client_for("memcached://admin:hunter2@127.0.0.1:11211")
    assert "hunter2" not in str(info.value)
    assert "memcached://admin:***@127.0.0.1:11211" in str(info.value)


# --- Sentinel: what a process believes about the primary -----------------------------------


def test_sentinel_watch_pins_a_promotion_until_the_sentinels_confirm_it() -> None:
    from django_redispatterns.connection.watch import Watch

    old, new = ("10.0.0.1", 6379), ("10.0.0.2", 6379)
    watch = Watch("svc", [("127.0.0.1", 1)], {})
    assert watch.accept(3, old) and watch.generation == 0
    watch.promoted(new)  # the probe saw the replica answer ROLE master
    moved = watch.generation
    assert moved == 1 and watch.pinned() == new
    assert not watch.accept(3, old), "a sentinel still naming the old primary is ignored"
    assert watch.pinned() == new and watch.generation == moved
    assert watch.accept(4, new)  # +switch-master: the configuration that confirms it
    assert watch.pinned() is None and watch.generation == moved
    assert not watch.accept(3, old), "an epoch older than one seen: that sentinel lags"
    watch.restart(0, old)  # every sentinel answers an older epoch: they were rebuilt
    assert watch.accept(0, old) and watch.generation == moved + 1


def test_sentinel_watch_drops_a_pin_on_abort() -> None:
    from django_redispatterns.connection.watch import Watch

    watch = Watch("svc", [("127.0.0.1", 1)], {})
    watch.accept(1, ("a", 1))
    watch.promoted(("b", 1))
    watch.aborted()
    assert watch.pinned() is None
    assert watch.accept(1, ("a", 1))


def test_sentinel_watch_listens_with_sync_options_even_for_an_asyncio_manager() -> None:
    """redis-py 8.2's asyncio Sentinel adds its asyncio Retry to ``sentinel_kwargs``; the
    watch's listeners are sync clients, and with it every call returned a coroutine."""
    import redis.asyncio.retry
    from redis.backoff import NoBackoff

    from django_redispatterns.connection.watch import Watch

    async_retry = redis.asyncio.retry.Retry(NoBackoff(), 1)
    watch = Watch("svc", [("127.0.0.1", 1)], {"socket_timeout": 0.5, "retry": async_retry})
    assert watch.sentinel_kwargs == {"socket_timeout": 0.5}
    client = redis.Redis("127.0.0.1", 1, **watch.sentinel_kwargs)
    with pytest.raises(redis.ConnectionError):  # a real call, not a coroutine
        client.ping()
