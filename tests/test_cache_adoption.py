"""Values this backend cannot decode, and the options of a rolling deploy (fast: no venvs;
the mixed fleet itself is tests/test_fleet_cache.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings

from django_redispatterns.cache import RedisCache, envelope
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


@pytest.mark.parametrize("options", [{}, {"GET_OR_SET_FORMAT": "plain"}, {"STALE_TTL": 30}],
                         ids=["default", "plain", "stale"])
def test_get_or_set_stores_django_redis_bytes(options: dict[str, Any]) -> None:
    cache = cache_with(**options)
    try:
        assert cache.get_or_set("k", lambda: {"v": 1}, 60) == {"v": 1}
        assert cache.get_or_set("n", lambda: 5, 60) == 5
        raw = cache.client.get_client()
        assert raw.get(cache.make_key("k")) == cache.client.encode({"v": 1})
        assert raw.get(cache.make_key("n")) == b"5"
        hard = 60_000 + 1000 * int(options.get("STALE_TTL", 0))
        assert 0 < raw.pttl(cache.make_key("k")) <= hard
        # The metadata lives beside the value, never longer.
        metadata = cache._codec.meta_key(cache.make_key("k"))
        assert raw.get(metadata) is not None
        assert 0 < raw.pttl(metadata) <= raw.pttl(cache.make_key("k")) + 50
        assert cache.get_or_set("k", lambda: pytest.fail("recomputed"), 60) == {"v": 1}
    finally:
        cache.clear()


def test_a_value_rewritten_by_a_plain_set_is_a_plain_hit() -> None:
    """An old process's set() of a get_or_set key leaves metadata that describes another
    value: that value is served as it is (no early refresh, never stale metadata's)."""
    cache = cache_with(XFETCH_BETA=1e9)  # every read of a described value refreshes early
    raw = cache.client.get_client()
    try:
        assert cache.get_or_set("k", lambda: "ours", 60) == "ours"
        raw.set(cache.make_key("k"), cache.client.encode("theirs"), ex=60)  # old process
        assert cache.get_or_set("k", lambda: pytest.fail("recomputed"), 60) == "theirs"
        assert cache.get("k") == "theirs"
        # A truncated metadata record is no metadata either.
        raw.set(cache._codec.meta_key(cache.make_key("k")), b"\x00\x93rm1\x00", ex=60)
        assert cache.get_or_set("k", lambda: pytest.fail("recomputed"), 60) == "theirs"
        # The same bytes as described: the metadata applies (XFetch picks a refresh).
        assert cache.get_or_set("n", lambda: time.sleep(0.01) or "mine", 60) == "mine"
        assert cache.get_or_set("n", lambda: "again", 60) == "again"
    finally:
        cache.clear()


def test_an_entry_written_by_0_1_0_is_read() -> None:
    """0.1.0 stored get_or_set values behind a header; this release reads them."""
    cache = cache_with()
    raw = cache.client.get_client()
    try:
        fresh = envelope.pack(cache._codec.encode({"old": 1}), 60, 0.01)
        raw.set(cache.make_key("k"), fresh, ex=60)
        assert cache.get("k") == {"old": 1}
        assert cache.get_or_set("k", lambda: pytest.fail("recomputed"), 60) == {"old": 1}
        stale = envelope.pack(cache._codec.encode({"old": 1}), -1, 0.01)
        raw.set(cache.make_key("k"), stale, ex=60)
        assert cache.get("k", "MISS") == "MISS"
        assert cache.get_or_set("k", lambda: {"new": 1}, 60) == {"new": 1}
        assert raw.get(cache.make_key("k")) == cache.client.encode({"new": 1})
    finally:
        cache.clear()


@pytest.mark.parametrize("options, named", [
    ({"GET_OR_SET_FORMAT": "pickle"}, "GET_OR_SET_FORMAT"),
    ({"LOCK_KEYS": "redis"}, "LOCK_KEYS"),
    ({"GET_OR_SET_FORMAT": "envelope"}, "GET_OR_SET_FORMAT"),
])
def test_bad_deploy_options_are_named(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        cache_with(**options)
