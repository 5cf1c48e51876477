"""Django-style cache OPTIONS on our backend: applied (never ignored), seen by everything
that reads the database, refused by name when nobody reads them (docs/cache.md,
"Options"; docs/checks.md, E012/W020/E013)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.cache.backends.redis import RedisSerializer
from django.test import override_settings
from redis.connection import BlockingConnectionPool

from django_redispatterns import connection
from django_redispatterns.checks.cache import check_cache_options, check_cache_serializers
from django_redispatterns.checks.targets import collect_targets
from django_redispatterns.connection.build import cache_location
from django_redispatterns.connection.cacheoptions import entry_urls, translate, with_db
from django_redispatterns.exceptions import ConfigurationError
from tests.redis_servers import RedisServer
from tests.test_cache_support import PREFIX, make_cache

OURS = "django_redispatterns.cache.RedisCache"


def caches(backend: str = OURS, location: Any = "redis://127.0.0.1:6379",
           **options: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "redis": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}}


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()


def test_db_option_is_the_database_written(server: RedisServer) -> None:
    cache = make_cache(server.url.rsplit("/", 1)[0], db=5)  # a URL naming no database
    cache.set("k", "v", 30)
    asyncio.run(cache.aset("ak", "av", 30))
    db5, db0 = server.client(db=5), server.client(db=0)
    assert {k.decode() for k in db5.keys("*")} == {f"{PREFIX}:1:k", f"{PREFIX}:1:ak"}
    assert db0.keys("*") == []
    assert cache.get("k") == "v"
    assert asyncio.run(cache.aget("ak")) == "av"


def test_features_sharing_the_alias_and_the_checks_use_that_database(
        server: RedisServer) -> None:
    base = server.url.rsplit("/", 1)[0]
    with override_settings(CACHES=caches(location=base, db=5)):
        connection.reset_clients()
        try:
            assert cache_location("redis") == f"{base}/5"
            connection.client_for("redis").set(f"{PREFIX}:shared", 1, ex=30)
            assert server.client(db=5).get(f"{PREFIX}:shared") == b"1"
            assert [t.dbs for t in collect_targets() if "cache 'redis'" in t.roles] == [{5}]
        finally:
            connection.reset_clients()


def test_socket_timeout_option_bounds_a_call_to_a_hung_server(server: RedisServer) -> None:
    cache = make_cache(server.url, socket_timeout=0.5, socket_connect_timeout=0.5,
                       SOCKET_TIMEOUT=None, SOCKET_CONNECT_TIMEOUT=None)
    assert cache.get_or_set("warm", 1, 30) == 1  # a pooled connection, scripts loaded
    pool = cache.client.get_client(write=False).connection_pool
    assert pool.connection_kwargs["socket_timeout"] == 0.5
    assert [c.socket_timeout for c in pool._available_connections] == [0.5]
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            cache.get("warm")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    server.pause()
    try:
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(30)  # generous: the timeout is 0.5 s
        assert not caller.is_alive(), "the call hung"
    finally:
        server.resume()
    assert isinstance(outcome[0], redis.TimeoutError), outcome


def test_pool_options_reach_the_pool(server: RedisServer) -> None:
    """Django's own test_redis_pool_options, on django-redis's pool."""
    cache = make_cache(server.url.rsplit("/", 1)[0], db=5, socket_timeout=0.1,
                       retry_on_timeout=True, max_connections=7, pool_class=BlockingConnectionPool,
                       SOCKET_TIMEOUT=None)
    pool = cache.client.get_client(write=False).connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert pool.connection_kwargs["db"] == 5
    assert pool.connection_kwargs["socket_timeout"] == 0.1
    assert pool.connection_kwargs["retry_on_timeout"] is True
    assert pool.max_connections == 7


def test_djangos_serializer_option_round_trips(server: RedisServer) -> None:
    cache = make_cache(server.url, serializer=RedisSerializer)
    for value in ({"a": [1, 2]}, 7, "text", None):
        cache.set("s", value, 30)
        assert cache.get("s") == value
    cache.set("n", 1, 30)
    assert cache.incr("n") == 2


@pytest.mark.parametrize(("options", "error"), [
    ({"db": 5, "CONNECTION_POOL_KWARGS": {"db": 6}}, "disagree"),
    ({"socket_timeout": 1, "SOCKET_TIMEOUT": 2}, "contradicts SOCKET_TIMEOUT"),
    ({"decode_responses": True}, "stores bytes"),
    ({"db": "five"}, "integer"),
])
def test_contradicting_options_are_refused(options: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        translate("redis://h:6379", options)


def test_a_database_the_url_names_is_not_silently_preferred() -> None:
    with pytest.raises(ConfigurationError, match="names database 0"):
        make_cache("redis://127.0.0.1:6379/0", db=5)
    assert translate("redis://h:6379/5", {"db": 5})[0] == "redis://h:6379/5"


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://h:6379", "redis://h:6379/3"),
    ("redis://h:6379/", "redis://h:6379/3"),
    ("rediss://u:p@h:6379?ssl_cert_reqs=none", "rediss://u:p@h:6379/3?ssl_cert_reqs=none"),
    ("unix:///tmp/r.sock", "unix:///tmp/r.sock?db=3"),
    ("redis+sentinel://a:26379,b:26379/mymaster", "redis+sentinel://a:26379,b:26379/mymaster/3"),
])
def test_the_database_goes_into_every_kind_of_url(url: str, expected: str) -> None:
    assert with_db(url, 3, strict=True) == expected


def test_every_location_of_a_list_gets_it() -> None:
    location, options = translate(["redis://a:1", "redis://b:1"], {"db": 2, "max_connections": 3})
    assert location == ["redis://a:1/2", "redis://b:1/2"]
    assert options == {"CONNECTION_POOL_KWARGS": {"max_connections": 3}}
    assert translate("redis://a:1,redis://b:1", {"db": 2})[0] == "redis://a:1/2,redis://b:1/2"


def test_entry_urls_of_each_backend() -> None:
    assert entry_urls(caches(db=4)["redis"]) == ["redis://127.0.0.1:6379/4"]
    django_own = caches("django.core.cache.backends.redis.RedisCache",
                        "redis://a:1;redis://b:1/0", db=4)["redis"]
    assert entry_urls(django_own) == ["redis://a:1/4", "redis://b:1/0"]  # the URL's wins
    django_redis = caches("django_redis.cache.RedisCache",
                          CONNECTION_POOL_KWARGS={"db": 4})["redis"]
    assert entry_urls(django_redis) == ["redis://127.0.0.1:6379/4"]


def _ids(messages: list[Any]) -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in messages]


def test_an_option_nobody_reads_is_an_error_naming_it() -> None:
    with override_settings(CACHES=caches(SOCKET_TIMOUT=1, db=3, max_connections=5,
                                         STALE_TTL=5)):
        found = _ids(check_cache_options())
    assert [i for i, _ in found] == ["redispatterns.E012"]
    assert "'SOCKET_TIMOUT'" in found[0][1]


def test_django_redis_own_backend_ignores_django_style_options() -> None:
    with override_settings(CACHES=caches("django_redis.cache.RedisCache", db=3,
                                         SOCKET_TIMEOUT=1)):
        found = _ids(check_cache_options())
    assert [i for i, _ in found] == ["redispatterns.E012"] and "'db'" in found[0][1]


def test_an_unknown_option_with_a_custom_class_is_a_warning() -> None:
    with override_settings(CACHES=caches(SERIALIZER="myproject.serializers.Custom",
                                         CUSTOM_LEVEL=3)):
        found = _ids(check_cache_options())
    assert [i for i, _ in found] == ["redispatterns.W020"]


def test_contradictions_are_a_check_error_too() -> None:
    with override_settings(CACHES=caches(location="redis://h:6379/0", db=5)):
        assert [i for i, _ in _ids(check_cache_options())] == ["redispatterns.E013"]


def test_djangos_pickle_serializer_option_is_seen_by_the_serializer_check() -> None:
    with override_settings(CACHES=caches(
            serializer="django.core.cache.backends.redis.RedisSerializer")):
        assert [m.id for m in check_cache_serializers()] == ["redispatterns.W018"]
