"""Connections and Lua on real Redis Cluster and Sentinel topologies.

URL forms (sync and asyncio), EVALSHA routing by key slot, NOSCRIPT recovery on every
node, pipelines of scripts split across nodes, TRYAGAIN/ASK during a live slot
migration, and "no silent re-send of a timed-out script" on both topologies.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from redis.exceptions import RedisClusterException

from django_redispatterns import connection, scripts
from django_redispatterns.exceptions import (
    BackendUnavailable,
    ClusterUnavailable,
    ConfigurationError,
)
from tests.redis_servers import KEY_PREFIX
from tests.topologies import ClusterTopology, SentinelTopology
from tests.topology_fixtures import use_connection

# Two keys in one slot (what every multi-key script of ours passes), plus a counter.
PAIR = scripts.LuaScript(
    "test_pair",
    b"-- KEYS: a, b (one slot). ARGV: none. Returns: INCR of b\n"
    b"redis.call('INCR', KEYS[1]); redis.call('PEXPIRE', KEYS[1], 60000)\n"
    b"local n = redis.call('INCR', KEYS[2]); redis.call('PEXPIRE', KEYS[2], 60000)\n"
    b"return n",
)
# A one-key script: INCR (with a TTL).
INCR = scripts.LuaScript(
    "test_incr",
    b"-- KEYS: a counter. ARGV: none. Returns: its INCR\n"
    b"local n = redis.call('INCR', KEYS[1]); redis.call('PEXPIRE', KEYS[1], 60000)\n"
    b"return n",
)


def tagged(tag: str, *names: str) -> list[str]:
    return [f"{KEY_PREFIX}:t:{{{tag}}}:{n}" for n in names]


def tags_on_every_master(cluster: ClusterTopology, count: int = 12) -> list[str]:
    """Hash tags whose slots cover every master (so a pipeline spans all nodes)."""
    tags = [f"n{i}" for i in range(count)]
    owners = {cluster.master_for_key("{" + t + "}").port for t in tags}
    assert len(owners) == len(cluster.masters())
    return tags


# --- URL forms ----------------------------------------------------------------------------


def test_cluster_url_gives_a_cluster_client_sync_and_async(cluster_settings: str) -> None:
    client = connection.get_client("LOCKS")
    assert connection.is_cluster(client)
    # keys spread over all three masters, written and read through one client
    for i in range(30):
        client.set(f"{KEY_PREFIX}:spread:{i}", i, px=60000)
    assert [int(client.get(f"{KEY_PREFIX}:spread:{i}")) for i in range(30)] == list(range(30))

    async def main() -> list[int]:
        aclient = connection.get_async_client("RATELIMIT")
        assert connection.is_cluster(aclient)
        try:
            return [int(await aclient.get(f"{KEY_PREFIX}:spread:{i}")) for i in range(30)]
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == list(range(30))


def test_cluster_url_rejects_a_database_number(redis_cluster: ClusterTopology) -> None:
    with pytest.raises(ConfigurationError) as info:
        connection.client_for(redis_cluster.url + "/2")
    assert "database 0" in str(info.value)


def test_sentinel_url_talks_to_the_primary_sync_and_async(
    redis_sentinel: SentinelTopology, sentinel_settings: str
) -> None:
    client = connection.get_client("SESSIONS")
    assert not connection.is_cluster(client)
    client.set(f"{KEY_PREFIX}:sentinel:k", "v", px=60000)
    assert client.info("replication")["role"] == "master"
    primary = redis_sentinel.primary().client()
    assert primary.get(f"{KEY_PREFIX}:sentinel:k") == b"v"

    async def main() -> bytes:
        aclient = connection.get_async_client("SESSIONS")
        try:
            assert (await aclient.info("replication"))["role"] == "master"
            return bytes(await aclient.get(f"{KEY_PREFIX}:sentinel:k"))
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == b"v"


def test_sentinel_url_selects_the_database(redis_sentinel: SentinelTopology) -> None:
    url = redis_sentinel.url[: -len("/0")] + "/3"
    with use_connection(url):
        connection.get_client().set(f"{KEY_PREFIX}:db3", "x", px=60000)
    assert redis_sentinel.primary().client(db=3).get(f"{KEY_PREFIX}:db3") == b"x"
    assert redis_sentinel.primary().client(db=0).get(f"{KEY_PREFIX}:db3") is None
    redis_sentinel.primary().client(db=3).delete(f"{KEY_PREFIX}:db3")


# --- Lua on Cluster -----------------------------------------------------------------------


def test_scripts_route_by_slot_and_survive_script_flush_on_every_node(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    tags = tags_on_every_master(redis_cluster)
    for tag in tags:
        assert PAIR(client, tagged(tag, "a", "b")) == 1
    redis_cluster.script_flush()  # what a restart or failover does to the script cache
    for tag in tags:
        assert PAIR(client, tagged(tag, "a", "b")) == 2  # NOSCRIPT -> EVAL, ran once
    for node in redis_cluster.masters():  # each call ran on the node owning its slot
        assert node.client().script_exists(PAIR.sha) == [True]


def test_run_many_pipelines_scripts_across_nodes_with_noscript_recovery(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    tags = tags_on_every_master(redis_cluster)
    calls = [(PAIR, tagged(tag, "a", "b"), ()) for tag in tags]
    assert scripts.run_many(client, calls) == [1] * len(tags)
    redis_cluster.script_flush()
    assert scripts.run_many(client, calls) == [2] * len(tags)

    async def main() -> list[object]:
        aclient = connection.get_async_client()
        try:
            redis_cluster.script_flush()
            return await scripts.arun_many(aclient, calls)
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == [3] * len(tags)


def test_async_script_call_recovers_from_noscript(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    async def main() -> list[int]:
        aclient = connection.get_async_client()
        try:
            first = await PAIR.acall(aclient, tagged("x", "a", "b"))
            redis_cluster.script_flush()
            return [first, await PAIR.acall(aclient, tagged("x", "a", "b"))]
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == [1, 2]


def test_keys_in_two_slots_fail_loudly_before_running(cluster_settings: str) -> None:
    client = connection.get_client()
    with pytest.raises(RedisClusterException, match="same key slot"):
        PAIR(client, [f"{KEY_PREFIX}:t:{{a}}:x", f"{KEY_PREFIX}:t:{{b}}:y"])
    assert client.get(f"{KEY_PREFIX}:t:{{a}}:x") is None


# --- slot migration: ASK, TRYAGAIN --------------------------------------------------------


def _other_master(cluster: ClusterTopology, slot: int) -> Any:
    owner = cluster.master_for_slot(slot)
    return next(m for m in cluster.masters() if m.port != owner.port)


def test_single_key_calls_follow_ask_during_a_slot_migration(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    key = f"{KEY_PREFIX}:t:{{mig1}}:only"
    client.set(key, 1, px=60000)
    slot = client.keyslot(key)
    target = _other_master(redis_cluster, slot)
    source = redis_cluster.migrate_slot_start(slot, target)
    try:
        redis_cluster.migrate_keys(source, target, [key])  # key now lives on the target
        assert client.incr(key) == 2  # ASK redirect followed transparently
        assert INCR(client, [key]) == 3  # a one-key script as well
    finally:
        redis_cluster.migrate_slot_finish(slot, source, target)
    assert int(client.get(key)) == 3
    assert redis_cluster.master_for_slot(slot).port == target.port


def split_pair(cluster: ClusterTopology, client: Any, tag: str) -> tuple[Any, ...]:
    """Write a tagged pair, then migrate its slot halfway: one key on each node, so every
    call touching both keys gets TRYAGAIN until the migration finishes."""
    a, b = tagged(tag, "a", "b")
    assert PAIR(client, [a, b]) == 1
    slot = client.keyslot(a)
    target = _other_master(cluster, slot)
    source = cluster.migrate_slot_start(slot, target)
    cluster.migrate_keys(source, target, [a])
    return a, b, slot, source, target


def test_multi_key_script_retries_tryagain_until_the_migration_ends(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    a, b, slot, source, target = split_pair(redis_cluster, client, "mig2")
    finisher = threading.Timer(0.3, redis_cluster.migrate_slot_finish, (slot, source, target))
    finisher.start()
    try:
        started = time.monotonic()
        assert PAIR(client, [a, b]) == 2  # retried with back-off, ran exactly once
        assert time.monotonic() - started < scripts.rejection_budget() + 1
    finally:
        finisher.join()
    assert int(client.get(a)) == 2 and int(client.get(b)) == 2


def test_multi_key_script_gives_a_clear_error_when_the_migration_does_not_end(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    a, b, slot, source, target = split_pair(redis_cluster, client, "mig3")
    try:
        started = time.monotonic()
        with pytest.raises(ClusterUnavailable, match="did not run") as info:
            PAIR(client, [a, b])
        elapsed = time.monotonic() - started
        budget = scripts.rejection_budget()  # SOCKET_TIMEOUT, 1 s in the tests
        assert budget == 1.0
        assert budget - 0.6 < elapsed < budget + 2
        # the error is also a redis error, so features' Redis-outage policies apply to it
        assert isinstance(info.value, redis.RedisError)
        assert isinstance(info.value, BackendUnavailable)
        # and pipelined calls get it in their result slot
        results = scripts.run_many(client, [(PAIR, [a, b], ()), (PAIR, tagged("ok", "a", "b"), ())])
        assert isinstance(results[0], ClusterUnavailable) and results[1] == 1
    finally:
        redis_cluster.migrate_slot_finish(slot, source, target)
    assert int(client.get(b)) == 1  # the rejected calls never ran
    assert PAIR(client, [a, b]) == 2


# --- No silent duplicate writes: a timed-out script is never re-sent ------------------------------


def test_cluster_client_does_not_resend_a_timed_out_script(
    redis_cluster: ClusterTopology, cluster_url: str
) -> None:
    # redis-py's RedisCluster retries TimeoutError 3 times by default: the script would run 4x.
    with use_connection(cluster_url, SOCKET_TIMEOUT=0.3):
        client = connection.get_client()
        key = tagged("slow", "n")[0]
        assert INCR(client, [key]) == 1  # the script is cached on the node, a connection open
        node = redis_cluster.master_for_key(key)
        with node.stopped_until_a_client_gives_up(), pytest.raises(redis.TimeoutError):
            INCR(client, [key])  # waits unread until the client gave up, then runs
        assert settled(node.client(), key) == 2  # once, not once per re-send


def test_cluster_pipeline_does_not_resend_a_timed_out_script(
    redis_cluster: ClusterTopology, cluster_url: str
) -> None:
    # redis-py's cluster pipeline re-sends, one by one, every command whose node timed out.
    with use_connection(cluster_url, SOCKET_TIMEOUT=0.3):
        client = connection.get_client()
        keys = [tagged(tag, "n")[0] for tag in tags_on_every_master(redis_cluster)]
        calls = [(INCR, [key], ()) for key in keys]
        assert scripts.run_many(client, calls) == [1] * len(keys)
        node = redis_cluster.master_for_key(keys[0])
        with node.stopped_until_a_client_gives_up():
            results = scripts.run_many(client, calls)
        slow = [k for k in keys if redis_cluster.master_for_key(k).port == node.port]
        # the stopped node's calls fail (a timeout; under heavy load the client may also see
        # its connection dropped) and are never re-sent: that is what the counts below prove
        assert all(isinstance(r, redis.RedisError) for k, r in zip(keys, results, strict=True)
                   if k in slow), results
        assert all(r == 2 for k, r in zip(keys, results, strict=True) if k not in slow)
        assert [settled(node.client(), k) for k in slow] == [2] * len(slow)  # not re-sent


def test_sentinel_client_does_not_resend_a_timed_out_script(
    redis_sentinel: SentinelTopology, sentinel_url: str
) -> None:
    with use_connection(sentinel_url, SOCKET_TIMEOUT=0.3):
        client = connection.get_client()
        key = f"{KEY_PREFIX}:slow"
        assert INCR(client, [key]) == 1
        primary = redis_sentinel.primary()
        with primary.stopped_until_a_client_gives_up(), pytest.raises(redis.TimeoutError):
            INCR(client, [key])
        assert settled(primary.client(), key) == 2


def settled(node: redis.Redis, key: str) -> int:
    """The counter once the timed-out call (and any copy of it) has run: every copy was sent
    before the call raised, and the running node reads them at once."""
    deadline = time.monotonic() + 10
    while int(node.get(key) or 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a re-sent copy, queued on another connection, would have run by now
    return int(node.get(key) or 0)


def test_async_multi_key_script_retries_tryagain_then_gives_a_clear_error(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = connection.get_client()
    a, b, slot, source, target = split_pair(redis_cluster, client, "mig4")

    async def main() -> list[object]:
        aclient = connection.get_async_client()
        try:
            with pytest.raises(ClusterUnavailable):
                await PAIR.acall(aclient, [a, b])  # the migration does not end in time
            finisher = threading.Timer(0.3, redis_cluster.migrate_slot_finish,
                                       (slot, source, target))
            finisher.start()
            try:
                return [await PAIR.acall(aclient, [a, b])]  # ends while we back off
            finally:
                finisher.join()
        finally:
            await aclient.aclose()

    assert asyncio.run(main()) == [2]
    assert int(client.get(b)) == 2
