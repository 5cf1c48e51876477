"""The near cache (``OPTIONS["NEAR_CACHE"]``) on a real Redis Cluster: one invalidation
channel per primary (docs/cache.md, "Near cache"), topology changes empty the local cache.

Writes by "another client" go through a second backend without a near cache. Every key
has a TTL (checked on every master by the ``cluster_url`` fixture after each test).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_redispatterns.cache import RedisCache
from tests.redis_servers import CACHE_PREFIX
from tests.topologies import ClusterTopology, wait_for

FACTORY = "django_redispatterns.connection.ConnectionFactory"
WAIT = 10.0  # generous bound for anything asynchronous on 2 shared cores
KEYS = [f"key-{i}" for i in range(30)]


def cluster_cache(url: str, near: bool = True) -> Any:
    options: dict[str, Any] = {"CONNECTION_FACTORY": FACTORY, "SOCKET_TIMEOUT": 2,
                               "SOCKET_CONNECT_TIMEOUT": 2}
    if near:
        options["NEAR_CACHE"] = {}
    return RedisCache([url], {"KEY_PREFIX": CACHE_PREFIX, "TIMEOUT": 60, "OPTIONS": options})


@pytest.fixture
def caches(cluster_url: str) -> Iterator[tuple[Any, Any]]:
    """(a cache with a near cache, another client's cache without one), same cluster."""
    cache = cluster_cache(cluster_url)
    assert cache._near._start().wait_ready(WAIT)
    try:
        yield cache, cluster_cache(cluster_url, near=False)
    finally:
        cache._near.stop()


def held(cache: Any, key: str) -> bool:
    return cache._near.lookup(str(cache.client.make_key(key))) is not None


def cached_locally(cache: Any, key: str, value: Any, timeout: Any = 60) -> None:
    """Write ``key`` and read it into the local cache (a late invalidation of an earlier
    fill may cost one extra miss, so read until it is held)."""
    cache.set(key, value, timeout)
    wait_for(lambda: cache.get(key) == value and held(cache, key), WAIT, "a local copy")


def owner(cluster: ClusterTopology, cache: Any, key: str) -> Any:
    return cluster.master_for_key(cache.make_key(key))


def test_one_channel_per_primary_and_writes_on_every_master_drop_local_copies(
        redis_cluster: ClusterTopology, caches: tuple[Any, Any]) -> None:
    cache, other = caches
    channels = cache._near.listener.listeners()
    assert sorted(channels) == sorted(f"127.0.0.1:{m.port}" for m in redis_cluster.masters())
    assert len({owner(redis_cluster, cache, k).port for k in KEYS}) == 3
    for key in KEYS:
        cached_locally(cache, key, {"v": key})
    other.set_many({key: "changed" for key in KEYS}, 60)
    wait_for(lambda: not any(held(cache, k) for k in KEYS), WAIT, "invalidations")
    assert cache.get_many(KEYS) == {key: "changed" for key in KEYS}
    assert all(cache.get(key) == "changed" for key in KEYS)


def test_read_your_writes_on_every_master(redis_cluster: ClusterTopology,
                                          caches: tuple[Any, Any]) -> None:
    cache, _ = caches
    for key in KEYS:
        cached_locally(cache, key, 1)
    for key in KEYS:  # no waiting: this process's own writes drop its local copies
        cache.set(key, 2, 60)
        assert cache.get(key) == 2
        cache.delete(key)
        assert cache.get(key) is None


def test_local_copy_never_outlives_the_key_and_async_reads_fill(
        caches: tuple[Any, Any]) -> None:
    cache, _ = caches
    cached_locally(cache, "short", "v", timeout=1)
    time.sleep(1.2)
    assert not held(cache, "short") and cache.get("short") is None
    cache.set("async", [1, 2], 60)

    async def read() -> Any:
        return await cache.aget("async")

    wait_for(lambda: asyncio.run(read()) == [1, 2] and held(cache, "async"), WAIT, "a fill")


def test_killing_one_nodes_channel_empties_the_local_cache_and_bypasses_it(
        redis_cluster: ClusterTopology, caches: tuple[Any, Any]) -> None:
    cache, other = caches
    for key in KEYS:
        cached_locally(cache, key, "v1")
    node = owner(redis_cluster, cache, KEYS[0])
    channels = cache._near.listener
    listener = channels.listeners()[f"127.0.0.1:{node.port}"]
    node.client().execute_command("CLIENT", "KILL", "ID", listener.client_id)
    wait_for(lambda: listener.losses >= 1, WAIT, "the channel loss")
    # emptied everywhere, not only the keys of that node
    assert not any(held(cache, k) for k in KEYS)
    other.set(KEYS[0], "v2", 60)
    assert cache.get(KEYS[0]) == "v2"
    wait_for(lambda: channels.ready, WAIT, "the channel back")
    cached_locally(cache, KEYS[0], "v3")
    other.set(KEYS[0], "v4", 60)
    wait_for(lambda: not held(cache, KEYS[0]), WAIT, "an invalidation on the new channel")
    assert cache.get(KEYS[0]) == "v4"


@pytest.mark.parametrize("first", ["fill", "write"])
def test_slot_migration_never_serves_the_old_owners_value(
        redis_cluster: ClusterTopology, caches: tuple[Any, Any], first: str) -> None:
    """After the migration either the near cache's own fill meets ``MOVED`` first, or
    the (shared) cluster client followed one for a write: both rebuild the channels."""
    cache, other = caches
    key, neighbour = f"migrating-{first}", "stays"
    cached_locally(cache, key, "old")
    cached_locally(cache, neighbour, "n")
    nkey = cache.make_key(key)
    slot = redis_cluster.client().keyslot(nkey)
    source = redis_cluster.master_for_slot(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    rebuilds = cache._near.listener.rebuilds
    redis_cluster.migrate_slot_start(slot, target)
    try:
        redis_cluster.migrate_keys(source, target, [nkey])
        wait_for(lambda: not held(cache, key), WAIT, "the migration's invalidation")
        assert cache.get(key) == "old"  # through ASK, from the target: not kept
        assert not held(cache, key) and not held(cache, neighbour)  # ASK emptied it
    finally:
        redis_cluster.migrate_slot_finish(slot, source, target)
    if first == "fill":
        assert cache.get(key) == "old"  # MOVED: read through the client, not kept
        assert cache._near.listener.rebuilds > rebuilds and not held(cache, key)
    other.set(key, "new", 60)  # on the new owner
    assert cache.get(key) == "new"
    wait_for(lambda: cache._near.listener.rebuilds > rebuilds, WAIT, "the channels rebuilt")
    cached_locally(cache, key, "newer")
    other.set(key, "newest", 60)
    wait_for(lambda: not held(cache, key), WAIT, "an invalidation from the new owner")
    assert cache.get(key) == "newest"


@pytest.mark.timeout(240)
def test_a_primary_failover_moves_its_channel_to_the_promoted_replica(
        cluster_factory: Any) -> None:
    """A killed primary's channel stays down; after the promotion the slot map is read
    again and the promoted replica gets a channel whose invalidations drop local copies."""
    cluster = cluster_factory(masters=3, replicas=1)
    cache, other = cluster_cache(cluster.url), cluster_cache(cluster.url, near=False)
    try:
        assert cache._near._start().wait_ready(WAIT)
        victim = owner(cluster, cache, "k")
        cached_locally(cache, "k", "before")
        cluster.wait_replicated(victim)
        replica = cluster.replica_of(victim)
        victim.kill()
        wait_for(lambda: not held(cache, "k"), WAIT, "the channel loss")
        wait_for(lambda: replica.is_master(), 60, "the promotion")
        wait_for(lambda: cache.get("k") == "before" and held(cache, "k"), 60,
                 "a local copy from the promoted replica")
        assert f"127.0.0.1:{replica.port}" in cache._near.listener.listeners()
        other.set("k", "after", 60)
        wait_for(lambda: not held(cache, "k"), WAIT, "an invalidation from the new primary")
        assert cache.get("k") == "after"
    finally:
        cache._near.stop()
