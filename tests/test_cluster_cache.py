"""The cache backend (``django_redispatterns.cache.RedisCache``) on Cluster and Sentinel.

``CACHES`` points at the topology through ``django_redispatterns.connection.ConnectionFactory``
(``LOCATION`` a one-element list holding a ``redis+cluster://`` or ``redis+sentinel://``
URL); ``REDIS_PATTERNS["CONNECTION"] = "patterns"`` then reuses that cache's client for
every feature.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings

from django_redispatterns import connection
from django_redispatterns.locks import Lock
from tests.redis_servers import CACHE_PREFIX, KEY_PREFIX
from tests.topologies import ClusterTopology, SentinelTopology
from tests.topology_fixtures import patterns_settings

FACTORY = "django_redispatterns.connection.ConnectionFactory"


def cache_settings(url: str, **options: Any) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "patterns": {
            "BACKEND": "django_redispatterns.cache.RedisCache",
            "LOCATION": [url],
            "KEY_PREFIX": CACHE_PREFIX,
            "TIMEOUT": 300,
            "OPTIONS": {"CONNECTION_FACTORY": FACTORY, "SOCKET_TIMEOUT": 2,
                        "SOCKET_CONNECT_TIMEOUT": 2, **options},
        },
    }


@pytest.fixture
def cluster_cache(cluster_url: str) -> Iterator[Any]:
    connection.reset_clients()
    with override_settings(CACHES=cache_settings(cluster_url),
                           REDIS_PATTERNS=patterns_settings("patterns")):
        yield caches["patterns"]
    connection.reset_clients()


def test_cache_api_across_slots_on_cluster(redis_cluster: ClusterTopology,
                                           cluster_cache: Any) -> None:
    cache = cluster_cache
    data = {f"key-{i}": {"i": i} for i in range(40)}
    cache.set_many(data, timeout=60)
    owners = {redis_cluster.master_for_key(cache.make_key(k)).port for k in data}
    assert len(owners) == 3  # the keys really live on every master
    assert cache.get_many([*data, "missing"]) == data  # MGET split per slot
    assert cache.get("key-7") == {"i": 7}
    assert cache.add("key-7", "other") is False
    assert cache.add("counter", 0, 60)
    assert cache.incr("counter", 1) == 1
    assert cache.incr("counter", 5) == 6
    cache.delete_many(["key-1", "key-2"])
    assert cache.get("key-1") is None and cache.get("key-3") == {"i": 3}
    assert 0 < cache.ttl("key-3") <= 60
    cache.clear()  # SCAN + UNLINK on every master, only this prefix
    assert cache.get_many(list(data)) == {}


def test_incr_beyond_64_bits_and_on_get_or_set_values_on_cluster(cluster_cache: Any) -> None:
    # both take the WATCH/MULTI path, which a Cluster allows only in a transaction
    assert cluster_cache.get_or_set("visits", lambda: 1, 60) == 1
    assert cluster_cache.incr("visits") == 2
    cluster_cache.set("huge", 2**63 - 1, 60)
    assert cluster_cache.incr("huge", 10) == 2**63 + 9
    assert 0 < cluster_cache.ttl("huge") <= 60


def test_get_or_set_runs_the_callable_once_across_threads_on_cluster(cluster_cache: Any) -> None:
    runs: list[int] = []
    results: list[Any] = []
    start = threading.Barrier(8)

    def compute() -> str:
        runs.append(1)
        time.sleep(0.3)  # a slow query: the others must wait, not recompute
        return "expensive"

    def worker() -> None:
        start.wait()
        results.append(cluster_cache.get_or_set("report:{tagged}", compute, timeout=60))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["expensive"] * 8
    assert len(runs) == 1
    assert cluster_cache.get_or_set("plain key", lambda: 1, timeout=60) == 1


def test_a_slow_computation_extends_its_short_claim_on_cluster(cluster_url: str) -> None:
    """The claim renewal (lua/cache_renew.lua) routes to the key's master: through a
    computation of several claim leases (1 s at a 0.3 s socket timeout) the lock stays."""
    connection.reset_clients()
    with override_settings(CACHES=cache_settings(cluster_url, SOCKET_TIMEOUT=0.3),
                           REDIS_PATTERNS=patterns_settings("patterns")):
        cache = caches["patterns"]
        lock = cache._companion_key(str(cache.make_key("slow:{report}")), "lock")
        probe = connection.get_client("LOCKS")
        samples: list[int] = []

        def slow() -> str:
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                samples.append(probe.pttl(lock))
                time.sleep(0.1)
            return "slow value"

        assert cache.get_or_set("slow:{report}", slow, timeout=60) == "slow value"
        assert len(samples) > 10 and all(0 < ms <= 1000 for ms in samples), samples
        assert not probe.exists(lock)
    connection.reset_clients()


def test_get_or_set_with_a_lone_closing_brace_on_cluster(cluster_cache: Any) -> None:
    # no helper key can share such a key's slot: Django's plain get_or_set is used there
    assert cluster_cache.get_or_set("odd}key", lambda: 2, timeout=60) == 2
    assert cluster_cache.get_or_set("odd}key", lambda: 3, timeout=60) == 2


def test_get_or_set_hit_while_its_slot_migrates(redis_cluster: ClusterTopology,
                                                cluster_cache: Any) -> None:
    """A value and its metadata on two nodes for a moment (one key moved): a hit still."""
    cache = cluster_cache
    assert cache.get_or_set("moving", lambda: {"v": 1}, timeout=60) == {"v": 1}
    nkey = cache.make_key("moving")
    slot = redis_cluster.client().keyslot(nkey)
    source = redis_cluster.master_for_slot(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    redis_cluster.migrate_slot_start(slot, target)
    try:
        redis_cluster.migrate_keys(source, target, [nkey])  # the metadata stays behind
        assert cache.get_or_set("moving", lambda: pytest.fail("recomputed"), 60) == {"v": 1}
    finally:
        redis_cluster.migrate_slot_finish(slot, source, target)
    assert cache.get_or_set("moving", lambda: pytest.fail("recomputed"), 60) == {"v": 1}


def test_async_cache_calls_on_cluster(cluster_cache: Any) -> None:
    async def main() -> tuple[Any, Any]:
        await cluster_cache.aset("async-key", [1, 2], timeout=60)
        got = await cluster_cache.aget("async-key")
        computed = await cluster_cache.aget_or_set("async-gos", lambda: "v", timeout=60)
        return got, computed

    assert asyncio.run(main()) == ([1, 2], "v")


def test_features_reuse_the_cache_alias_cluster_client(cluster_cache: Any) -> None:
    connection.ConnectionFactory._shared.clear()  # first use goes through the alias
    client = connection.get_client("LOCKS")  # (this once deadlocked on a shared lock)
    assert connection.is_cluster(client)
    with Lock("via-alias", ttl=5) as lock:
        assert lock.owned()

    async def main() -> bool:
        aclient = connection.get_async_client("LOCKS")
        try:
            return connection.is_cluster(aclient) and await aclient.ping()
        finally:
            await aclient.aclose()

    assert asyncio.run(main())


def test_cache_through_sentinel_with_our_url_form(
    redis_sentinel: SentinelTopology, sentinel_url: str
) -> None:
    connection.reset_clients()
    with override_settings(CACHES=cache_settings(sentinel_url),
                           REDIS_PATTERNS=patterns_settings("patterns")):
        cache = caches["patterns"]
        cache.set("s-key", "v", timeout=60)
        assert redis_sentinel.primary().client().pttl(cache.make_key("s-key")) > 0
        assert cache.get_or_set("s-gos", lambda: 3, timeout=60) == 3
        assert asyncio.run(cache.aget("s-key")) == "v"
    connection.reset_clients()


def test_django_redis_native_sentinel_alias_gives_sync_and_async_clients(
    redis_sentinel: SentinelTopology, sentinel_url: str
) -> None:
    """django-redis's own Sentinel set-up (SentinelClient + SENTINELS) as the features'
    connection alias: sync clients come from django-redis, asyncio clients are built
    from the same SENTINELS list and find the same primary."""
    native = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "patterns": {
            "BACKEND": "django_redispatterns.cache.RedisCache",
            "LOCATION": f"redis://{redis_sentinel.service}/0",
            "KEY_PREFIX": CACHE_PREFIX,
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", s.port) for s in redis_sentinel.sentinels],
                "SOCKET_TIMEOUT": 2,
            },
        },
    }
    connection.reset_clients()
    with override_settings(CACHES=native, REDIS_PATTERNS=patterns_settings("patterns")):
        connection.get_client("LOCKS").set(f"{KEY_PREFIX}:native", "1", px=60000)

        async def main() -> Any:
            aclient = connection.get_async_client("LOCKS")
            try:
                return await aclient.get(f"{KEY_PREFIX}:native"), await aclient.info("replication")
            finally:
                await aclient.aclose()

        value, info = asyncio.run(main())
    connection.reset_clients()
    assert value == b"1" and info["role"] == "master"


def test_connection_factory_passes_plain_urls_to_django_redis(redis_url: str,
                                                              redis_client: Any) -> None:
    """With a plain redis:// LOCATION our factory is django-redis's own: same pool, options.
    (The app's URL: ``redis_url`` is the harness user's when there is one.)"""
    connection.reset_clients()
    with override_settings(CACHES=cache_settings(settings.REDIS_URL)):
        cache = caches["patterns"]
        client = cache.client.get_client()
        assert not connection.is_cluster(client)
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 2
        cache.set("plain-factory", 1, timeout=60)
        assert redis_client.pttl(cache.make_key("plain-factory")) > 0
        cache.client.connection_factory.disconnect(client)  # the CLOSE_CONNECTION path
        assert cache.get("plain-factory") == 1  # the pool reconnects
    connection.reset_clients()
