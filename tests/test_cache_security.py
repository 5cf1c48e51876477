"""The cache backend's inherited and convenience APIs keep the house rules: ``@cached``
keys by identity, ``clear()`` deletes only keys it can prove are its own, every
inherited write has a TTL, ``lock()`` has a lease, ``keys()`` never sends ``KEYS``."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django_redis.cache import RedisCache as DjangoRedisCache

from django_redispatterns.cache import (
    UncacheableArgument,
    UnscopedKeysError,
    cached,
)
from django_redispatterns.exceptions import (
    ConfigurationError,
    MissingTTLError,
    RedisPatternsError,
)
from django_redispatterns.locks import Lock
from tests import test_cache
from tests.redis_servers import KEY_PREFIX, RedisServer
from tests.test_cache import commands, diff
from tests.test_cache_support import PREFIX, make_cache
from tests.test_checks import key_with_prefix_last, key_without_prefix, key_without_version

cache = test_cache.cache  # the backend fixture, with its every-key-has-a-TTL check
# django-redis keeps one pool per URL per process, built with the options of the first
# cache on it: caches of these tests on the shared URL use the settings' socket options.
SAME_POOL = {"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": 2}

# --- @cached keys by identity ----------------------------------------------------------


@pytest.mark.django_db
def test_cached_model_arguments_with_equal_str_do_not_share_an_entry(cache: Any) -> None:
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    # Two rows with the same display text (a user who can choose that text could
    # otherwise read the other row's cached result).
    ct = ContentType.objects.get_for_model(Permission)
    mine = Permission.objects.create(name="Can read", codename="read_mine", content_type=ct)
    theirs = Permission.objects.create(name="Can read", codename="read_theirs",
                                       content_type=ct)
    assert str(mine) == str(theirs) and repr(mine) == repr(theirs)

    @cached(timeout=60, cache="patterns")
    def secret_of(row: Any) -> str:
        return str(row.codename)

    assert secret_of(mine) == "read_mine"
    assert secret_of(theirs) == "read_theirs"
    assert secret_of.cache_key(mine) != secret_of.cache_key(theirs)  # type: ignore[attr-defined]
    # The same row fetched again is the same entry.
    again = Permission.objects.get(pk=mine.pk)
    assert secret_of.cache_key(again) == secret_of.cache_key(mine)  # type: ignore[attr-defined]
    assert secret_of.invalidate(mine) and secret_of.invalidate(theirs)  # type: ignore[attr-defined]
    # The same pk in another database (one database per tenant) is another row.
    elsewhere = Permission.objects.get(pk=mine.pk)
    elsewhere._state.db = "tenant-b"
    assert secret_of.cache_key(elsewhere) != secret_of.cache_key(mine)  # type: ignore[attr-defined]


def test_cached_refuses_unsaved_instances_and_unknown_types(cache: Any) -> None:
    from django.contrib.auth.models import User

    runs: list[Any] = []

    @cached(timeout=60, cache="patterns")
    def describe(thing: Any) -> str:
        runs.append(thing)
        return "x"

    class Printable:
        def __repr__(self) -> str:
            return "same"

    for bad in (User(username="new"), Printable(), object(), [Printable()], {"k": object()}):
        with pytest.raises(UncacheableArgument) as info:
            describe(bad)
        assert isinstance(info.value, TypeError) and isinstance(info.value, RedisPatternsError)
        assert "key=" in str(info.value) or "not saved" in str(info.value)
    assert runs == []

    # key= names the identity explicitly: a template or a callable.
    @cached(timeout=60, key=lambda thing: f"printable:{id(thing)}", cache="patterns")
    def by_callable(thing: Any) -> str:
        return "ok"

    thing = Printable()
    assert by_callable(thing) == "ok"
    assert by_callable.cache_key(thing) == f"printable:{id(thing)}"  # type: ignore[attr-defined]
    by_callable.invalidate(thing)  # type: ignore[attr-defined]


def test_cached_plain_values_are_type_tagged_and_canonical(cache: Any) -> None:
    @cached(timeout=60, cache="patterns")
    def echo(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    def k(*args: Any, **kwargs: Any) -> str:
        return str(echo.cache_key(*args, **kwargs))  # type: ignore[attr-defined]

    distinct = [
        (1,), ("1",), (1.0,), (True,), (None,), (b"1",), (decimal.Decimal("1"),),
        ((1,),), ([1],), (frozenset({1}),), ("a,b",), ("a", "b"), ({"a": 1},),
        (uuid.UUID(int=1),), (datetime.date(2026, 1, 2),),
        (datetime.datetime(2026, 1, 2),),
        (datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc),),
    ]
    keys = [k(*args) for args in distinct]
    assert len(set(keys)) == len(keys)
    # Order-free containers, and the same call spelled two ways, share one key.
    assert k({"a": 1, "b": 2}) == k({"b": 2, "a": 1})
    assert k(frozenset({"x", "y"})) == k(frozenset({"y", "x"}))

    @cached(timeout=60, cache="patterns")
    def report(year: int, month: int = 1) -> str:
        return f"{year}-{month}"

    key = report.cache_key(2026, 1)  # type: ignore[attr-defined]
    assert key == report.cache_key(2026) == report.cache_key(year=2026, month=1)  # type: ignore[attr-defined]
    assert report(2026) == "2026-1"
    assert report.invalidate(year=2026) is True  # type: ignore[attr-defined]


def test_cached_async_functions_key_by_identity_too(cache: Any) -> None:
    @cached(timeout=60, cache="patterns")
    async def lookup(thing: Any) -> str:
        return "x"

    async def run() -> None:
        assert await lookup(1) == "x"
        with pytest.raises(UncacheableArgument):
            await lookup(object())
        assert await lookup.ainvalidate(1) is True  # type: ignore[attr-defined]

    asyncio.run(run())


# --- clear() / delete_pattern() only delete provably own keys ---------------------------


@pytest.mark.parametrize("key_function", [key_without_prefix, key_without_version,
                                          key_with_prefix_last])
def test_clear_refuses_a_key_function_that_does_not_scope_keys(
        redis_url: str, redis_client: redis.Redis, key_function: Any) -> None:
    backend = make_cache(redis_url, **SAME_POOL)
    backend.key_func = key_function
    others = {f"{KEY_PREFIX}:sessions:abc": b"session",
              f"{KEY_PREFIX}:lock:{{locks}}:fence:x": b"7",
              f"{PREFIX}:1:another-cache": b"other"}
    for name, value in others.items():
        redis_client.set(name, value, ex=60)
    backend.set("mine", 1, 60)
    try:
        with pytest.raises(UnscopedKeysError) as info:
            backend.clear()
        assert "clear() refused, nothing deleted" in str(info.value)
        with pytest.raises(UnscopedKeysError):
            asyncio.run(backend.aclear())
        with pytest.raises(UnscopedKeysError):
            backend.delete_pattern("*")
        for name, value in others.items():
            assert redis_client.get(name) == value, name
        assert backend.get("mine") == 1
    finally:
        redis_client.delete(*others, backend.make_key("mine"))


def test_scope_proof_agrees_with_the_key_function_check() -> None:
    import hashlib

    from django.core.cache.backends.base import default_key_func

    from django_redispatterns.cache import scope

    def version_first(key: str, key_prefix: str, version: int) -> str:
        return f"v{version}|{key_prefix}|{key}"

    def hashed_key(key: str, key_prefix: str, version: int) -> str:
        return f"{key_prefix}:{version}:{hashlib.sha256(key.encode()).hexdigest()}"

    def hashed_all(key: str, key_prefix: str, version: int) -> str:
        return hashlib.sha256(f"{key_prefix}:{version}:{key}".encode()).hexdigest()

    for prefix in ("app", "", "a*b[c]", "rp-scope-probe"):
        assert scope.problem(default_key_func, prefix) is None, prefix
        assert scope.problem(version_first, prefix) is None, prefix
    assert "does not match" in str(scope.problem(hashed_key, "app"))
    assert scope.problem(hashed_all, "app") is not None
    assert "drops the KEY_PREFIX" in str(scope.problem(key_without_prefix, "app"))
    assert "drops the version" in str(scope.problem(key_without_version, "app"))
    assert "fixed text" in str(scope.problem(key_with_prefix_last, "app"))
    # A prefix with glob characters is matched literally.
    pattern = scope.own_pattern(default_key_func, "a*b[c]", "clear()")
    assert scope.glob_regex(pattern).fullmatch("a*b[c]:3:k")
    assert not scope.glob_regex(pattern).fullmatch("aXb[c]:3:k")
    assert not scope.glob_regex(pattern).fullmatch("a*bc:3:k")


def test_clear_with_the_default_key_function_still_runs(
        redis_url: str, redis_client: redis.Redis) -> None:
    backend = make_cache(redis_url, **SAME_POOL)
    backend.set("mine", 1, 60)
    redis_client.set(f"{KEY_PREFIX}:sessions:abc", b"session", ex=60)
    backend.clear()
    assert backend.get("mine") is None
    assert redis_client.get(f"{KEY_PREFIX}:sessions:abc") == b"session"
    redis_client.delete(f"{KEY_PREFIX}:sessions:abc")


# --- TTL through inherited writers ------------------------------------------------------


@pytest.mark.skipif(not hasattr(DjangoRedisCache, "smembers"),
                    reason="this django-redis has no set, hash or sorted-set methods to read back")
def test_inherited_writers_give_every_key_a_ttl(cache: Any, redis_client: redis.Redis) -> None:
    def ttl(key: str) -> int:
        return int(redis_client.pttl(cache.make_key(key)))

    assert cache.sadd("s1", "a", "b") == 2
    assert cache.sadd("s2", "b", "c", timeout=20) == 2
    assert cache.smembers("s1") == {"a", "b"}
    assert 0 < ttl("s1") <= 300_000 and 0 < ttl("s2") <= 20_000
    assert cache.sdiffstore("diff", "s1", "s2") == 1
    assert cache.sinterstore("inter", "s1", "s2", timeout=30) == 1
    assert cache.sunionstore("union", "s1", "s2") == 3
    assert cache.smove("s1", "moved", "a") is True
    assert cache.smembers("moved") == {"a"}
    assert cache.hset("h", "f", {"v": 1}) == 1
    assert cache.hset("h2", mapping={"a": 1, "b": 2}, timeout=40) == 2
    assert cache.hexists("h", "f") and cache.hlen("h2") == 2
    assert cache.zadd("z", {"m": 1.0, "n": 2.0}) == 2
    assert cache.zincrby("z2", 2.5, "m") == 2.5
    assert cache.zscore("z", "n") == 2.0
    for key in ("diff", "inter", "union", "moved", "h", "h2", "z", "z2"):
        assert 0 < ttl(key) <= 300_000, key
    assert ttl("inter") <= 30_000 and ttl("h2") <= 40_000
    with pytest.raises(MissingTTLError):
        cache.sadd("s3", "x", timeout=None)
    with pytest.raises(MissingTTLError):
        cache.hset("h3", "f", 1, timeout=None)
    assert not cache.has_key("s3") and not cache.has_key("h3")


def test_inherited_writer_and_its_ttl_are_one_transaction(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    probe = server.client()
    backend = make_cache(server.url)
    backend.sadd("warm", "x")
    before = commands(probe)
    backend.sadd("one-trip", "x")
    assert diff(before, commands(probe)) == {"multi": 1, "sadd": 1, "pexpire": 1, "exec": 1}
    assert 0 < probe.pttl(backend.make_key("one-trip")) <= 300_000


def test_allow_no_ttl_lets_inherited_writers_keep_keys(
        redis_url: str, redis_client: redis.Redis) -> None:
    backend = make_cache(redis_url, ALLOW_NO_TTL=True, **SAME_POOL)
    try:
        assert backend.sadd("forever", "x", timeout=None) == 1
        assert redis_client.pttl(backend.make_key("forever")) == -1
        assert backend.sadd("default", "x") == 1
        assert 0 < redis_client.pttl(backend.make_key("default")) <= 300_000
    finally:
        redis_client.delete(backend.make_key("forever"), backend.make_key("default"))


# --- lock() and keys() ------------------------------------------------------------------


def test_lock_is_the_leased_fenced_lock(cache: Any) -> None:
    lock = cache.lock("report", timeout=5)
    assert isinstance(lock, Lock)
    assert lock.ttl == 5
    assert lock.acquire(blocking=False)
    assert lock.fencing_token is not None
    other = cache.lock("report", timeout=5, blocking=False)
    assert other.acquire() is False  # held: no wait, no steal
    assert other.acquire(False) is False and other.acquire(True, blocking_timeout=0.05) is False
    lock.release()
    assert other.acquire(blocking=False)
    other.release()
    # Without a timeout the lease is the locks' default, never "forever".
    default = cache.lock("report-default")
    assert default.ttl > 0 and default.ttl != float("inf")
    with pytest.raises(TypeError):
        cache.lock("report", client=object())
    renewed = cache.lock("report-renewed", timeout=5, auto_renew=True)
    with renewed:
        assert renewed.auto_renew and renewed.owned()


def test_lock_works_in_async_code(cache: Any) -> None:
    async def run() -> None:
        async with cache.lock("async-report", timeout=5) as held:
            assert held.fencing_token is not None
            assert not await cache.lock("async-report", blocking=False).aacquire()
        again = cache.lock("async-report", blocking=False)
        assert await again.aacquire()
        await again.arelease()

    asyncio.run(run())


def test_lock_of_a_crashed_holder_frees_itself(cache: Any) -> None:
    holder = cache.lock("crashy", timeout=1)
    assert holder.acquire(blocking=False)  # and the holder "crashes": never releases
    waiter = cache.lock("crashy", blocking_timeout=20)
    got = threading.Event()
    thread = threading.Thread(target=lambda: waiter.acquire() and got.set())
    thread.start()
    thread.join(30)
    assert got.is_set()  # within the generous bound, the lease ended
    waiter.release()


def test_keys_walks_with_scan_not_keys(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    probe = server.client()
    backend = make_cache(server.url)
    for i in range(30):
        backend.set(f"kscan-{i}", i, 30)
    probe.set("not-ours", 1, ex=30)
    before = commands(probe)
    found = backend.keys("kscan-*")
    sent = diff(before, commands(probe))
    assert sorted(found) == sorted(f"kscan-{i}" for i in range(30))
    assert set(sent) == {"scan"}, sent


# --- the same on Redis Cluster and when Redis is down -----------------------------------


def test_inherited_writers_keys_and_lock_on_cluster(cluster_url: str) -> None:
    from django.test import override_settings

    from django_redispatterns import connection
    from tests.test_cluster_cache import cache_settings
    from tests.topology_fixtures import patterns_settings

    connection.reset_clients()
    try:
        with override_settings(CACHES=cache_settings(cluster_url),
                               REDIS_PATTERNS=patterns_settings("patterns")):
            cluster = caches["patterns"]
            raw = cluster.client.get_client(write=True)
            try:
                raw.pipeline(transaction=True)
            except redis.exceptions.RedisClusterException:  # redis-py before 6
                with pytest.raises(ConfigurationError, match="redis-py 6 or later"):
                    cluster.sadd("cset-old", "a", timeout=60)
                pytest.skip("this redis-py has no MULTI on Redis Cluster")
            for i in range(12):  # keys on every master
                assert cluster.sadd(f"cset-{i}", "a", timeout=60) == 1
                assert cluster.hset(f"chash-{i}", "f", i) == 1
                assert cluster.zadd(f"czset-{i}", {"m": 1.0}) == 1
            for prefix in ("cset", "chash", "czset"):
                for i in range(12):
                    assert 0 < raw.pttl(cluster.make_key(f"{prefix}-{i}")) <= 300_000
            assert sorted(cluster.keys("cset-*")) == sorted(f"cset-{i}" for i in range(12))
            lock = cluster.lock("cluster-lock", timeout=5)
            with lock:
                assert lock.fencing_token is not None
            cluster.clear()
            assert cluster.keys("c*") == []
    finally:
        connection.reset_clients()


def test_inherited_writers_follow_ignore_exceptions(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    quiet = make_cache(server.url, IGNORE_EXCEPTIONS=True, SOCKET_TIMEOUT=1,
                       SOCKET_CONNECT_TIMEOUT=1)
    loud = make_cache(server.url, SOCKET_TIMEOUT=1, SOCKET_CONNECT_TIMEOUT=1)
    server.kill()
    assert quiet.sadd("s", "x") is None
    assert quiet.hset("h", "f", 1) is None
    assert quiet.keys("*") == []
    with pytest.raises(redis.exceptions.ConnectionError):
        loud.sadd("s", "x")
    with pytest.raises(redis.exceptions.ConnectionError):
        loud.keys("*")
