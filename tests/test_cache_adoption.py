"""Values this backend cannot decode, and the options of a rolling deploy (fast: no venvs;
the mixed fleet itself is tests/test_fleet_cache.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from django_redispatterns.cache import RedisCache
from django_redispatterns.exceptions import ConfigurationError
from tests.redis_servers import CACHE_PREFIX

LZ4 = "django_redis.compressors.lz4.Lz4Compressor"
JSON = "django_redis.serializers.json.JSONSerializer"
# What another process may have left under a key: a truncated pickle, bytes of another
# serializer or compressor, a truncated envelope.
BAD = {"pickle": b"\x80\x04\x95\x10", "json": b"{\"a\": [1,", "lz4": b"\x04\x22garbage",
       "envelope": b"\x00\x93rp1\x00\x01"}


def cache_with(**options: Any) -> RedisCache:
    location = settings.CACHES["default"]["LOCATION"]
    return RedisCache(location, {"TIMEOUT": 60, "KEY_PREFIX": f"{CACHE_PREFIX}-adopt",
                                 "OPTIONS": options})


@pytest.mark.parametrize("options", [{}, {"SERIALIZER": JSON}, {"COMPRESSOR": LZ4}],
                         ids=["pickle", "json", "lz4"])
def test_an_undecodable_value_is_a_miss_and_is_replaced(options: dict[str, Any]) -> None:
    cache = cache_with(**options)
    raw = cache.client.get_client()
    try:
        for name, junk in BAD.items():
            raw.set(cache.make_key(name), junk, ex=60)
            assert cache.get(name, "MISS") == "MISS", name
            assert cache.get_many([name]) == {}, name
            assert cache.get_or_set(name, lambda: {"fresh": 1}, 60) == {"fresh": 1}, name
            assert cache.get(name) == {"fresh": 1}, name  # the bad value was replaced
    finally:
        cache.clear()


def test_plain_get_or_set_stores_django_redis_bytes() -> None:
    cache = cache_with(GET_OR_SET_FORMAT="plain")
    try:
        assert cache.get_or_set("k", lambda: {"v": 1}, 60) == {"v": 1}
        assert cache.get_or_set("n", lambda: 5, 60) == 5
        raw = cache.client.get_client()
        assert raw.get(cache.make_key("k")) == cache.client.encode({"v": 1})
        assert raw.get(cache.make_key("n")) == b"5"
        assert 0 < raw.pttl(cache.make_key("k")) <= 60_000
        assert cache.get_or_set("k", lambda: pytest.fail("recomputed"), 60) == {"v": 1}
    finally:
        cache.clear()


@pytest.mark.parametrize("options, named", [
    ({"GET_OR_SET_FORMAT": "pickle"}, "GET_OR_SET_FORMAT"),
    ({"LOCK_KEYS": "redis"}, "LOCK_KEYS"),
    ({"GET_OR_SET_FORMAT": "plain", "STALE_TTL": 30}, "STALE_TTL"),
])
def test_bad_deploy_options_are_named(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        cache_with(**options)
