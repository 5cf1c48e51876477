"""A rolling deploy from django-redis (5.4, 6, 7) or Django's own Redis backend to this one.

Old processes (real django-redis / Django installed in venvs of their own, see
:mod:`tests.fleet`) and this backend share one Redis with the same LOCATION, KEY_PREFIX and
VERSION. Every value written on one side is read the same on the other, or is a clean miss;
no call raises. ``cache.lock(name)`` on both sides excludes the other.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_redispatterns.cache import RedisCache
from tests.fleet import Peer, django_redis_peer
from tests.redis_servers import RedisServer
from tests.sdists import private_server

pytestmark = pytest.mark.slow

SERIALIZERS = {
    "pickle": {},
    "json": {"SERIALIZER": "django_redis.serializers.json.JSONSerializer"},
    "msgpack": {"SERIALIZER": "django_redis.serializers.msgpack.MSGPackSerializer"},
    "pickle+zlib": {"COMPRESSOR": "django_redis.compressors.zlib.ZlibCompressor"},
    "json+lz4": {"SERIALIZER": "django_redis.serializers.json.JSONSerializer",
                 "COMPRESSOR": "django_redis.compressors.lz4.Lz4Compressor"},
}
SAMPLES = {"s": "text é", "i": 42, "neg": -7, "f": 2.5, "t": True, "l": [1, "x", None],
           "d": {"a": [1, 2], "b": "c"}, "big": 2**40}

# The old side: read what the new side wrote, write its own, run each extra; never raises
# (an exception is returned as ["error", ...] and fails the test).
OLD_SIDE = '''
from django.core.cache import caches
def op(f):
    try:
        return ["ok", f()]
    except Exception as exc:
        return ["error", "%s: %s" % (type(exc).__name__, exc)]
result = {}
for alias in aliases:
    c = caches[alias]
    extras = hasattr(c, "ttl")
    r = result[alias] = {}
    r["get"] = {k: op(lambda k=k: c.get("n:" + k, "MISS")) for k in samples}
    r["get_many"] = op(lambda: c.get_many(["n:" + k for k in samples]))
    r["gos"] = op(lambda: c.get("n:gos", "MISS"))
    r["incr"] = op(lambda: c.incr("n:count", 5))
    r["decr"] = op(lambda: c.decr("n:count", 1))
    r["touch"] = op(lambda: c.touch("n:touch", 1000))
    if extras:
        r["ttl"] = op(lambda: c.ttl("n:touch"))
        r["delete_pattern"] = op(lambda: c.delete_pattern("n:pat:*"))
    for k, v in samples.items():
        c.set("o:" + k, v, 600)
    c.set_many({"o:m:" + k: v for k, v in samples.items()}, 600)
    c.set("o:count", 7, 600)
    c.set("o:touch", "t", 600)
    for i in range(3):
        c.set("o:pat:%d" % i, i, 600)
    conn = c.client.get_client() if extras else c._cache.get_client(write=True)
    r["raw"] = op(lambda: conn.set(c.make_key("o:truncated"), b"\\x80\\x04\\x95", ex=600))
'''


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from private_server()


def settings_for(url: str, prefix: str, backend: str, names: list[str]) -> dict[str, Any]:
    caches_ = {}
    for name in names:
        entry: dict[str, Any] = {"BACKEND": backend, "LOCATION": url, "TIMEOUT": 600,
                                 "KEY_PREFIX": f"{prefix}-{name}", "VERSION": 3}
        if "django_redis" in backend:
            entry["OPTIONS"] = dict(SERIALIZERS[name])
        caches_[name] = entry
    return {"CACHES": {"default": caches_[names[0]], **caches_}}


def ours(url: str, prefix: str, name: str) -> RedisCache:
    """This backend with its default options beside django-redis's (docs/migration.md)."""
    return RedisCache(url, {"TIMEOUT": 600, "KEY_PREFIX": f"{prefix}-{name}", "VERSION": 3,
                            "OPTIONS": dict(SERIALIZERS[name])})


def check_mixed_fleet(peer: Peer, url: str, backend: str, names: list[str]) -> None:
    prefix = "fleet-" + secrets.token_hex(4)
    new = {name: ours(url, prefix, name) for name in names}
    for c in new.values():  # the new side writes first
        for k, v in SAMPLES.items():
            c.set("n:" + k, v)
        c.set("n:count", 10)
        c.set("n:touch", "t")
        c.get_or_set("n:gos", lambda: {"computed": 1}, 600)
        for i in range(3):
            c.set(f"n:pat:{i}", i)
    seen = peer.run(settings_for(url, prefix, backend, names), OLD_SIDE,
                    aliases=names, samples=SAMPLES)
    for name, c in new.items():
        r = seen[name]
        where = f"{peer.name} {backend.rsplit('.', 2)[-2]} {name}"
        assert r["get"] == {k: ["ok", v] for k, v in SAMPLES.items()}, where
        assert r["get_many"] == ["ok", {"n:" + k: v for k, v in SAMPLES.items()}], where
        # A get_or_set entry (default options) is the value to an old process.
        assert r["gos"] == ["ok", {"computed": 1}], where
        assert r["incr"] == ["ok", 15] and r["decr"] == ["ok", 14], where
        assert r["touch"] == ["ok", True], where
        if "ttl" in r:
            assert r["ttl"][0] == "ok" and 900 < r["ttl"][1] <= 1000, where
            assert r["delete_pattern"] == ["ok", 3], where
            assert all(c.get(f"n:pat:{i}") is None for i in range(3)), where
        assert r["raw"] == ["ok", True], where
        # ... and this side reads what the old side wrote.
        assert {k: c.get("o:" + k) for k in SAMPLES} == SAMPLES, where
        assert c.get_many(["o:m:" + k for k in SAMPLES]) == {
            "o:m:" + k: v for k, v in SAMPLES.items()}, where
        assert c.get("n:count") == 14 and c.incr("o:count", 3) == 10, where
        assert c.decr("o:count") == 9 and c.get("o:count") == 9, where
        assert c.touch("o:touch", 900) and 800 < c.ttl("o:touch") <= 900, where
        assert c.delete_pattern("o:pat:*") == 3, where
        # A value this side cannot decode (truncated by the old side) is a miss.
        assert c.get("o:truncated", "MISS") == "MISS", where
        assert c.get_many(["o:truncated", "o:s"]) == {"o:s": SAMPLES["s"]}, where
        assert c.get_or_set("o:truncated", "fresh", 60) == "fresh", where
        c.clear()


@pytest.mark.parametrize("version", ["5.4", "6", "7"])
def test_django_redis_fleet_reads_and_writes_the_same(server: RedisServer,
                                                      version: str) -> None:
    check_mixed_fleet(django_redis_peer(version), server.url,
                      "django_redis.cache.RedisCache", list(SERIALIZERS))


def test_django_builtin_redis_fleet_reads_and_writes_the_same(server: RedisServer) -> None:
    """Django's own backend pickles (ints stay plain): the same bytes as django-redis's
    default pickle serializer without a compressor."""
    check_mixed_fleet(django_redis_peer("7"), server.url,
                      "django.core.cache.backends.redis.RedisCache", ["pickle"])


LOCK_SIDE = """
lock = cache.lock("job", timeout=30)
if token:
    lock.local.token = token.encode()
    lock.release()
    result = "released"
else:
    result = lock.acquire(blocking=False) and lock.local.token.decode()
"""


@pytest.mark.parametrize("version", ["5.4", "7"])
def test_cache_lock_excludes_a_django_redis_process(server: RedisServer, version: str,
                                                    settings: Any) -> None:
    peer = django_redis_peer(version)
    prefix = "fleet-" + secrets.token_hex(4)
    fleet = settings_for(server.url, prefix, "django_redis.cache.RedisCache", ["pickle"])
    entry = {**fleet["CACHES"]["pickle"], "BACKEND": "django_redispatterns.cache.RedisCache"}
    with override_settings(CACHES={**settings.CACHES, "fleet": entry}):
        cache = caches["fleet"]
        assert isinstance(cache, RedisCache)
        token = peer.run(fleet, LOCK_SIDE, token="")
        assert isinstance(token, str), token  # the old process holds "job"
        ours_ = cache.lock("job", timeout=30)
        assert not ours_.acquire(blocking=False)
        assert peer.run(fleet, LOCK_SIDE, token=token) == "released"
        assert ours_.acquire(blocking=False)
        try:
            assert cache.has_key("job")  # django-redis's own key for the name
            assert peer.run(fleet, LOCK_SIDE, token="") is False
        finally:
            ours_.release()
        token = peer.run(fleet, LOCK_SIDE, token="")
        assert isinstance(token, str)
        assert peer.run(fleet, LOCK_SIDE, token=token) == "released"
        cache.clear()
