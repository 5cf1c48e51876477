"""Every feature while the slot of its keys moves to another master.

Two shapes of move, for each feature's read-then-write pair of calls:

* a **whole move** between the read and the write: the write reaches the old owner, is
  answered ``MOVED``, and lands on a new owner that has never loaded the script
  (``NOSCRIPT``, then ``EVAL``): it runs exactly once, with the right outcome;
* a **split slot** at the write (``MIGRATING``/``IMPORTING``, some of the call's keys
  already moved): single-key calls follow ``ASK`` (again onto a node without the script),
  multi-key calls are refused with ``TRYAGAIN`` and are re-sent within the socket bound
  until the migration ends. They never run half on one node.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client, override_settings
from redis.crc import key_slot

from django_redispatterns import connection
from django_redispatterns.locks import Lock
from django_redispatterns.locks._names import fence_key, held_key
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.ratelimit.limiter import hit_many
from django_redispatterns.sessions import SessionStore, logout_everywhere
from django_redispatterns.sessions.keyspace import keys_of
from tests import test_cluster_cache
from tests.redis_servers import KEY_PREFIX
from tests.test_cluster_connection import INCR
from tests.topologies import ClusterNode, ClusterTopology, wait_for
from tests.topology_fixtures import use_connection
from tests.urls_idempotency import idem_settings, post, runs

ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket"]


def slot_of(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))


def other_master(cluster: ClusterTopology, slot: int) -> ClusterNode:
    owner = cluster.master_for_slot(slot)
    return next(m for m in cluster.masters() if m.port != owner.port)


def move_slot(cluster: ClusterTopology, slot: int) -> ClusterNode:
    """Move ``slot`` (and its keys) to another master whose script cache is then emptied,
    so the next call there meets ``NOSCRIPT``; returns the new owner."""
    target = other_master(cluster, slot)
    source = cluster.migrate_slot_start(slot, target)
    cluster.migrate_slot_finish(slot, source, target)
    target.client().script_flush()
    return target


@contextlib.contextmanager
def split_slot(cluster: ClusterTopology, slot: int, moved: list[str],
               finish_after: float | None = 0.4) -> Iterator[ClusterNode]:
    """Hold ``slot`` half-migrated (only ``moved`` on the new owner, which has no scripts
    cached) for the block; the migration finishes ``finish_after`` seconds in (or at the
    end of the block when None). Yields the new owner."""
    target = other_master(cluster, slot)
    source = cluster.migrate_slot_start(slot, target)
    cluster.migrate_keys(source, target, moved)
    target.client().script_flush()
    finisher = None
    if finish_after is not None:
        finisher = threading.Timer(finish_after, cluster.migrate_slot_finish,
                                   (slot, source, target))
        finisher.start()
    try:
        yield target
    finally:
        if finisher is not None:
            finisher.join()
        else:
            cluster.migrate_slot_finish(slot, source, target)
    assert cluster.master_for_slot(slot).port == target.port


# --- locks ---------------------------------------------------------------------------------


def test_lock_keeps_working_when_its_slot_moves_while_held(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    held = Lock("mv-held", ttl=30, auto_renew=False)
    assert held.acquire()
    slot = slot_of(held_key("mv-held"))
    move_slot(redis_cluster, slot)
    assert not Lock("mv-held", ttl=5).acquire()  # MOVED, NOSCRIPT, still exclusive
    held.extend(30)  # raises LockNotOwned unless it ran on the new owner
    assert held.owned()
    held.release()
    with Lock("mv-held", ttl=5) as again:
        assert again.fencing_token > held.fencing_token  # type: ignore[operator]


def test_lock_release_with_its_keys_split_is_retried_and_runs_once(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    held = Lock("mv-split", ttl=30, auto_renew=False)
    assert held.acquire()
    slot = slot_of(held_key("mv-split"))
    client = connection.get_client("LOCKS")
    with split_slot(redis_cluster, slot, [held_key("mv-split")]):
        started = time.monotonic()
        held.release()  # its key is on the new owner: ASK, NOSCRIPT there, then EVAL
        # lock key on the new owner (gone), fence on the old one: TRYAGAIN until the end
        with Lock("mv-split", ttl=5) as again:
            assert again.fencing_token > held.fencing_token  # type: ignore[operator]
        assert time.monotonic() - started < 10
    assert client.get(held_key("mv-split")) is None
    assert int(client.get(fence_key("mv-split"))) == again.fencing_token


# --- rate limits -----------------------------------------------------------------------------


def only_key(cluster: ClusterTopology, pattern: str) -> bytes:
    found = cluster.scan_keys(pattern)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rate_limit_stays_exact_when_its_slot_moves(
    redis_cluster: ClusterTopology, cluster_settings: str, algorithm: str
) -> None:
    limiter = RateLimiter("4/m", algorithm=algorithm)
    assert limiter.hit("mover").allowed
    key = only_key(redis_cluster, f"{KEY_PREFIX}:rl:*")
    slot = slot_of(key)
    move_slot(redis_cluster, slot)  # between two decisions
    assert limiter.hit("mover").allowed  # MOVED, then NOSCRIPT on the new owner
    with split_slot(redis_cluster, slot, [key.decode()], finish_after=None):
        assert limiter.hit("mover").allowed  # ASK onto a node without the script
    assert [limiter.hit("mover").allowed for _ in range(3)] == [True, False, False]


def test_several_rules_in_one_pipeline_follow_ask_and_stay_exact(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    rules = [RateLimiter("3/m", algorithm=a) for a in ALGORITHMS]

    def decide() -> list[bool]:
        return [d.allowed for d in hit_many([(r, "piped", 1, None) for r in rules])]

    assert decide() == [True] * 3
    moved = [k.decode() for k in redis_cluster.scan_keys(f"{KEY_PREFIX}:rl:*")]
    slots = {slot_of(k) for k in moved}
    assert len(moved) == 3 and len(slots) == 1  # one identity: one tag for every rule
    with split_slot(redis_cluster, slots.pop(), moved, finish_after=None):
        assert decide() == [True] * 3
    assert decide() == [True] * 3
    assert decide() == [False] * 3


# --- sessions --------------------------------------------------------------------------------


def signed_in(user_id: str) -> SessionStore:
    store = SessionStore()
    store[SESSION_KEY] = user_id
    store["n"] = 1
    store.save()
    return store


@pytest.mark.django_db
def test_session_saved_after_its_slot_moved_between_load_and_save(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        store = signed_in("41")
        assert store.session_key is not None
        data, index, _sid = keys_of(store.session_key)
        assert slot_of(data) == slot_of(index)
        loaded = SessionStore(store.session_key)
        assert loaded["n"] == 1  # the read
        move_slot(redis_cluster, slot_of(data))
        loaded["n"] = 2
        loaded.save()  # the write: MOVED, NOSCRIPT, then it runs once
        assert SessionStore(store.session_key)["n"] == 2
        assert logout_everywhere(41) == 1


@pytest.mark.django_db
def test_logout_everywhere_with_the_users_keys_split_revokes_every_session(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        stores = [signed_in("42") for _ in range(3)]
        data, index, _sid = keys_of(str(stores[0].session_key))
        with split_slot(redis_cluster, slot_of(index), [index, data]):
            assert logout_everywhere(42) == 3  # refused (TRYAGAIN) until the move ends
        for store in stores:
            assert SessionStore(store.session_key).get(SESSION_KEY) is None
        assert logout_everywhere(42) == 0


# --- idempotency -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_idempotent_post_completes_when_its_slot_moves_while_the_view_runs(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    moved: list[int] = []
    url = "/charge/?sleep=1.5&name=mv"  # the view sleeps 1.5 s; the slot moves at 0.3 s

    def move_the_record() -> None:  # the claim is written; the view is still running
        key = only_key(redis_cluster, f"{KEY_PREFIX}:*idem*")
        moved.append(move_slot(redis_cluster, slot_of(key)).port)

    with idem_settings(CONNECTION=cluster_settings):
        client = Client()
        mover = threading.Timer(0.3, move_the_record)
        mover.start()
        try:
            first = post(client, url, key="mv1")
        finally:
            mover.join()
        assert moved and first.status_code == 201
        again = post(client, url, key="mv1")  # the same request: replayed
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert again.content == first.content
    assert runs_on_test_redis("mv") == 1  # the view ran once


def runs_on_test_redis(name: str) -> int:
    import redis
    from django.conf import settings

    from tests.redis_servers import url_client_kwargs

    url = settings.REDIS_URL
    return runs(redis.Redis.from_url(url, socket_timeout=5, **url_client_kwargs(url)), name)


# --- cache -----------------------------------------------------------------------------------

cluster_cache = test_cluster_cache.cluster_cache  # the fixture: the cache backend on the cluster


def test_get_or_set_stores_once_when_the_slot_moves_during_the_computation(
    redis_cluster: ClusterTopology, cluster_cache: Any
) -> None:
    cache = cluster_cache
    slot = slot_of(cache.make_key("mv-whole"))
    calls: list[int] = []

    def compute() -> str:  # between the claim (read) and the settle (write)
        calls.append(1)
        move_slot(redis_cluster, slot)
        return "fresh"

    assert cache.get_or_set("mv-whole", compute, 60) == "fresh"
    assert cache.get_or_set("mv-whole", compute, 60) == "fresh" and calls == [1]
    assert redis_cluster.master_for_slot(slot).port == redis_cluster.master_for_key(
        cache.make_key("mv-whole")).port
    assert 0 < cache.ttl("mv-whole") <= 60
    value_key = cache.make_key("mv-whole")
    # the compute claim is gone; the value and its metadata companion stay (one slot)
    assert sorted(redis_cluster.scan_keys("*mv-whole*")) == sorted(
        k.encode() for k in cache._codec.hit_keys(value_key))


def test_get_or_set_settles_once_when_its_keys_are_split_during_the_computation(
    redis_cluster: ClusterTopology, cluster_cache: Any
) -> None:
    cache = cluster_cache
    value_key = cache.make_key("mv-split")
    slot = slot_of(value_key)
    split: list[contextlib.ExitStack] = []

    def compute() -> str:  # the claim's key moves; the value's key does not exist yet
        claim = [k.decode() for k in redis_cluster.scan_keys("*mv-split*")]
        assert claim and value_key not in claim
        stack = contextlib.ExitStack()
        stack.enter_context(split_slot(redis_cluster, slot, claim))
        split.append(stack)
        return "fresh"

    try:
        assert cache.get_or_set("mv-split", compute, 60) == "fresh"  # TRYAGAIN, re-sent
    finally:
        for stack in split:
            stack.close()
    assert cache.get("mv-split") == "fresh" and 0 < cache.ttl("mv-split") <= 60
    assert sorted(redis_cluster.scan_keys("*mv-split*")) == sorted(
        k.encode() for k in cache._codec.hit_keys(value_key))  # the claim is gone


# --- a master that just joined -----------------------------------------------------------------


def split_to_a_new_master(cluster: ClusterTopology,
                          keys: list[str]) -> tuple[ClusterNode, ClusterNode]:
    """A master joins (after the client read the slot map); the slot of ``keys`` starts
    migrating to it and ``keys`` move. Returns (old owner, new master)."""
    new = ClusterNode()
    cluster.nodes.append(new)
    cluster.nodes[0].client().execute_command(
        "CLUSTER", "MEET", "127.0.0.1", new.port, new.bus_port)
    wait_for(lambda: new.cluster_info()["cluster_state"] == "ok", 30, "the new node")
    known = str(len(cluster.nodes))  # every node has met it (SETSLOT names it by id)
    wait_for(lambda: all(n.cluster_info()["cluster_known_nodes"] == known
                         for n in cluster.nodes), 30, "every node to meet the new one")
    source = cluster.migrate_slot_start(slot_of(keys[0]), new)
    cluster.migrate_keys(source, new, keys)
    return source, new


def test_ask_to_a_master_the_client_has_not_seen_yet(cluster_factory: Any) -> None:
    """A slot migrating to a master that joined after the client read the slot map: the
    ``ASK`` names a node the client does not know. redis-py then fails with an
    ``AttributeError`` (an answer 500); ours learns the node and runs the call once."""
    cluster = cluster_factory(masters=2)
    with use_connection(cluster.url):
        client = connection.get_client()
        limiter = RateLimiter("5/m")
        assert limiter.hit("late").allowed  # the client knows the two masters only
        key = only_key(cluster, f"{KEY_PREFIX}:rl:*")
        plain = f"{key.decode()}:plain"  # a plain key in the same slot (same hash tag)
        client.set(plain, "v", px=60000)
        source, new = split_to_a_new_master(cluster, [key.decode(), plain])
        try:
            assert client.get(plain) == b"v"  # ASK to the new master
            assert limiter.hit("late").allowed  # a script, the same way
        finally:
            cluster.migrate_slot_finish(slot_of(key), source, new)
        assert [limiter.hit("late").allowed for _ in range(4)] == [True] * 3 + [False]


def test_async_ask_to_a_master_the_client_has_not_seen_yet(cluster_factory: Any) -> None:
    cluster = cluster_factory(masters=2)
    key = f"{KEY_PREFIX}:late:{{late}}:plain"

    async def main() -> list[Any]:
        aclient = connection.get_async_client()
        try:
            await aclient.set(key, "v", px=60000)  # the client knows the two masters only
            source, new = split_to_a_new_master(cluster, [key])
            try:
                return [await aclient.get(key), await INCR.acall(aclient, [key + ":n"])]
            finally:
                cluster.migrate_slot_finish(slot_of(key), source, new)
        finally:
            await aclient.aclose()

    with use_connection(cluster.url):
        assert asyncio.run(main()) == [b"v", 1]
