"""Django's cache contract where django-redis differs (docs/cache.md, "Differences from
Django's Redis backend"); the whole of Django's own cache tests runs in
tests/test_cache_django.py, these pin each fix on its own, sync and async."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
import redis
from django.core.cache.backends.base import CacheKeyWarning

from django_redispatterns.cache import RedisCache
from django_redispatterns.exceptions import NotAnIntegerError
from tests.test_cache_support import make_cache


@pytest.fixture
def cache(redis_client: redis.Redis, redis_url: str) -> Any:
    return make_cache(redis_url)


def test_set_many_returns_an_empty_list(cache: Any) -> None:
    assert cache.set_many({"a": 1, "b": 2}, 30) == []
    assert cache.set_many({}, 30) == []
    assert make_cache(cache._server, TTL_JITTER=0.1).set_many({"c": 3}, 30) == []


@pytest.mark.parametrize("value", [None, 0, "", b"\x00"])
def test_incr_version_moves_falsy_values_with_their_ttl(cache: Any, redis_client: redis.Redis,
                                                        value: Any) -> None:
    cache.set("v", value, 100)
    assert cache.incr_version("v") == 2
    assert cache.get("v", "missing") == "missing"
    assert cache.get("v", "missing", version=2) == value
    pttl = redis_client.pttl(cache.client.make_key("v", version=2))
    assert 0 < pttl <= 100_000
    assert cache.decr_version("v", version=2) == 1
    assert cache.get("v", "missing") == value


def test_incr_version_of_a_missing_key_raises(cache: Any) -> None:
    with pytest.raises(ValueError, match="not found"):
        cache.incr_version("absent")


def test_aincr_version_keeps_none_and_the_ttl(cache: Any, redis_client: redis.Redis) -> None:
    cache.set("av", None, 100)

    async def go() -> Any:
        return await cache.aincr_version("av"), await cache.adecr_version("av", version=2)

    assert asyncio.run(go()) == (2, 1)
    assert cache.get("av", "missing") is None
    assert 0 < redis_client.pttl(cache.client.make_key("av")) <= 100_000


def test_incr_of_a_non_integer_raises_what_both_django_backends_raise(cache: Any) -> None:
    cache.set("word", "abc", 30)
    cache.set("nothing", None, 30)
    for key in ("word", "nothing"):
        with pytest.raises(NotAnIntegerError) as raised:
            cache.incr(key)
        assert isinstance(raised.value, TypeError)
        assert isinstance(raised.value, redis.ResponseError)
        with pytest.raises(TypeError):
            asyncio.run(cache.aincr(key))


def test_a_non_integer_is_no_outage_for_ignore_exceptions(redis_client: redis.Redis,
                                                          redis_url: str) -> None:
    cache = make_cache(redis_url, IGNORE_EXCEPTIONS=True)
    cache.set("word", "abc", 30)
    with pytest.raises(NotAnIntegerError):
        cache.decr("word")


def test_get_backend_timeout_is_djangos_redis_answer(cache: Any) -> None:
    assert cache.get_backend_timeout(10) == 10
    assert cache.get_backend_timeout(-5) == 0
    assert cache.get_backend_timeout(None) is None
    assert cache.get_backend_timeout() == 300


BAD_KEYS = {"space": "a b", "control": "a\x01b", "long": "k" * 260}
CALLS = {
    "get": lambda c, k: c.get(k), "set": lambda c, k: c.set(k, 1, 30),
    "add": lambda c, k: c.add(k, 1, 30), "delete": lambda c, k: c.delete(k),
    "touch": lambda c, k: c.touch(k, 30), "has_key": lambda c, k: c.has_key(k),
    "get_many": lambda c, k: c.get_many([k]), "set_many": lambda c, k: c.set_many({k: 1}, 30),
    "delete_many": lambda c, k: c.delete_many([k]),
    "get_or_set": lambda c, k: c.get_or_set(k, 1, 30),
    "incr": lambda c, k: c.incr(k, ignore_key_check=True),
    "ttl": lambda c, k: c.ttl(k), "expire": lambda c, k: c.expire(k, 30),
    "aget": lambda c, k: asyncio.run(c.aget(k)),
    "aset": lambda c, k: asyncio.run(c.aset(k, 1, 30)),
    "aget_or_set": lambda c, k: asyncio.run(c.aget_or_set(k, 1, 30)),
}


@pytest.mark.parametrize("kind", sorted(BAD_KEYS))
@pytest.mark.parametrize("call", sorted(CALLS))
def test_keys_memcached_rejects_warn_on_every_method(cache: Any, call: str, kind: str) -> None:
    with pytest.warns(CacheKeyWarning):
        CALLS[call](cache, BAD_KEYS[kind])


def test_good_keys_do_not_warn(cache: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheKeyWarning)
        for call in CALLS.values():
            call(cache, "ключ-ok:{tag}")


class StrictKeys(RedisCache):
    def validate_key(self, key: str) -> None:
        if "forbidden" in key:
            raise ValueError(f"refused {key}")


def test_a_backends_own_validate_key_is_honoured(redis_client: redis.Redis,
                                                 redis_url: str) -> None:
    cache = StrictKeys(redis_url, {"KEY_PREFIX": make_cache(redis_url).key_prefix,
                                   "OPTIONS": {"SOCKET_TIMEOUT": 5}})
    with pytest.raises(ValueError, match="refused"):
        cache.set("forbidden", 1, 30)
    cache.set("allowed", 1, 30)
    assert cache.get("allowed") == 1


def test_cache_tag_with_timeout_none_is_refused_by_the_ttl_policy(
        redis_client: redis.Redis) -> None:
    """By design: every key has a TTL, so ``{% cache None %}`` raises when it renders."""
    from django.template import engines

    from django_redispatterns.exceptions import MissingTTLError

    template = engines["django"].from_string(
        '{% load cache %}{% cache None frag using="patterns" %}x{% endcache %}')
    with pytest.raises(MissingTTLError):
        template.render({})
    timed = engines["django"].from_string(
        '{% load cache %}{% cache 30 frag using="patterns" %}x{% endcache %}')
    assert timed.render({}) == "x"
