"""The near cache (``OPTIONS["NEAR_CACHE"]``): each line of its contract in docs/cache.md,
"Near cache", on real redis-servers of the test's own (faults kill connections and
restart servers).

To show that *this process's* writes drop local entries by themselves, some tests mute
the invalidation channel's delivery to the store (``mute``): Redis still sends the
messages, the store just does not hear them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis

from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.tracking.config import read_config
from django_redispatterns.tracking.store import ENTRY_OVERHEAD, LocalStore
from tests import near_workers
from tests.redis_servers import RedisServer
from tests.test_cache_support import make_cache
from tests.topologies import wait_for

WAIT = 10.0  # generous bound for anything asynchronous on 2 shared cores


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()


def near_cache(url: str, near: dict[str, Any] | None = None, **options: Any) -> Any:
    cache = make_cache(url, NEAR_CACHE=near or {}, **options)
    assert cache._near._start().wait_ready(WAIT)  # else the first near read starts it
    return cache


@pytest.fixture
def cache(server: RedisServer) -> Iterator[Any]:
    cache = near_cache(server.url)
    yield cache
    cache._near.stop()


def held(cache: Any, key: str, version: int | None = None) -> bool:
    """Is ``key`` held in this process's memory right now?"""
    return cache._near.lookup(str(cache.client.make_key(key, version=version))) is not None


def cached_locally(cache: Any, key: str, value: Any, timeout: Any = 60) -> None:
    """Write ``key`` and read it into the local cache. When an earlier fill had tracked
    the key, Redis's invalidation for this very write may land just after the refill (on
    a loaded machine) and drop it: one extra miss, so read again until it is held."""
    cache.set(key, value, timeout)
    wait_for(lambda: cache.get(key) == value and held(cache, key), WAIT, "a local copy")


def mute(cache: Any) -> None:
    cache._near.listener._invalidate = lambda keys: None


# --- settings ---------------------------------------------------------------------------

def test_off_by_default(server: RedisServer) -> None:
    cache = make_cache(server.url)
    assert cache._near is None
    cache.set("k", 1)
    assert cache.get("k") == 1


@pytest.mark.parametrize(("value", "words"), [
    ("yes", "must be a dict"),
    ({"MAX_ENTRIES": 0}, "MAX_ENTRIES"),
    ({"MAX_ENTRIES": 1.5}, "MAX_ENTRIES"),
    ({"MAX_BYTES": True}, "MAX_BYTES"),
    ({"PREFIXES": "user:"}, "PREFIXES"),
    ({"PREFIXES": []}, "PREFIXES"),
    ({"PREFIXES": ["ok", ""]}, "PREFIXES"),
    ({"MAX_LOCAL_TTL": 0}, "MAX_LOCAL_TTL"),
    ({"MAX_LOCAL_TTL": "5"}, "MAX_LOCAL_TTL"),
    ({"MAX_ENTRYS": 10}, "unknown keys"),
])
def test_bad_settings_raise_naming_the_setting(value: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        read_config(value)


def test_herd_client_is_refused(server: RedisServer) -> None:
    with pytest.raises(ConfigurationError, match="DefaultClient"):
        make_cache(server.url, NEAR_CACHE={}, CLIENT_CLASS="django_redis.client.HerdClient")


def test_prefixes_choose_the_keys_kept_locally(server: RedisServer) -> None:
    cache = near_cache(server.url, {"PREFIXES": ["hot:"]})
    try:
        cache.set("hot:a", 1)
        cache.set("cold:a", 2)
        assert (cache.get("hot:a"), cache.get("cold:a")) == (1, 2)
        assert held(cache, "hot:a")
        assert not held(cache, "cold:a")
    finally:
        cache._near.stop()


# --- 1. read your writes ----------------------------------------------------------------

WRITES: dict[str, Callable[[Any], Any]] = {
    "set": lambda c: c.set("k", "new", 60),
    "add (refused)": lambda c: c.add("k", "new", 60),
    "delete": lambda c: c.delete("k"),
    "touch": lambda c: c.touch("k", 60),
    "expire": lambda c: c.expire("k", 60),
    "pexpire": lambda c: c.pexpire("k", 60_000),
    "expire_at": lambda c: c.expire_at("k", datetime.now() + timedelta(minutes=1)),
    "pexpire_at": lambda c: c.pexpire_at("k", datetime.now() + timedelta(minutes=1)),
    "clear": lambda c: c.clear(),
    "set_many": lambda c: c.set_many({"k": "new", "other": 1}, 60),
    "delete_many": lambda c: c.delete_many(["k", "other"]),
    "incr_version": lambda c: c.incr_version("k"),
    "delete_pattern": lambda c: c.delete_pattern("k*"),
    "aset": lambda c: asyncio.run(c.aset("k", "new", 60)),
    "adelete": lambda c: asyncio.run(c.adelete("k")),
    "aadd (refused)": lambda c: asyncio.run(c.aadd("k", "new", 60)),
    "atouch": lambda c: asyncio.run(c.atouch("k", 60)),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_own_write_drops_the_local_entry_before_returning(cache: Any, write: str) -> None:
    cached_locally(cache, "k", "old")
    mute(cache)
    WRITES[write](cache)
    assert not held(cache, "k")
    keeps_value = write in ("add (refused)", "touch", "expire", "pexpire", "expire_at",
                            "pexpire_at", "aadd (refused)", "atouch")
    assert (cache.get("k") == "old") is keeps_value


def test_persist_drops_the_local_entry(server: RedisServer) -> None:
    cache = near_cache(server.url, ALLOW_NO_TTL=True)
    try:
        cached_locally(cache, "k", "v")
        mute(cache)
        cache.persist("k")
        assert not held(cache, "k")
        assert cache.get("k") == "v"
        assert held(cache, "k")  # now without a TTL: only an invalidation drops it
        cache.delete("k")
    finally:
        cache._near.stop()


def test_instances_of_one_configuration_share_the_near_cache(cache: Any,
                                                             server: RedisServer) -> None:
    """Django builds one backend per thread: another thread's write is read back at once,
    and the process keeps one channel."""
    twin = make_cache(server.url, NEAR_CACHE={})  # what another thread gets
    assert twin._near is cache._near
    cached_locally(cache, "k", "old")
    mute(cache)
    done = threading.Thread(target=twin.set, args=("k", "new", 60))
    done.start()
    done.join()
    assert cache.get("k") == "new"
    assert make_cache(server.url, NEAR_CACHE={"MAX_ENTRIES": 5})._near is not cache._near


def test_incr_and_decr_are_read_back(cache: Any) -> None:
    cached_locally(cache, "n", 5)
    mute(cache)
    cache.incr("n")
    assert cache.get("n") == 6
    cache.decr("n", 2)
    assert cache.get("n") == 4
    asyncio.run(cache.aincr("n"))
    assert cache.get("n") == 5


def test_get_or_set_store_is_read_back(cache: Any) -> None:
    mute(cache)
    assert cache.get_or_set("g", lambda: "computed", 60) == "computed"
    assert cache.get_or_set("g", lambda: "again", 60) == "computed"
    assert held(cache, "g")  # the second call's fill
    cache.delete("g")
    assert cache.get_or_set("g", lambda: "recomputed", 60) == "recomputed"
    assert cache.get("g") == "recomputed"


def test_aget_answers_local_hits_and_reads_its_own_async_writes(cache: Any) -> None:
    cached_locally(cache, "k", "old")
    mute(cache)

    async def scenario() -> list[Any]:
        seen = [await cache.aget("k")]
        await cache.aset("k", "new", 60)
        seen.append(await cache.aget("k"))
        return seen

    assert asyncio.run(scenario()) == ["old", "new"]


def test_aget_fills_and_aget_or_set_stores_are_read_back(cache: Any) -> None:
    mute(cache)

    async def scenario() -> list[Any]:
        await cache.aset("a", "v", 60)
        seen = [await cache.aget("a"), held(cache, "a"), await cache.aget("a")]
        seen.append(await cache.aget_or_set("g", lambda: "computed", 60))
        seen.append(await cache.aget("g"))  # fills
        seen.append(held(cache, "g"))
        seen.append(await cache.aget_or_set("g", lambda: "unused", 60))  # a local hit
        await cache.adelete("g")
        seen.append(await cache.aget_or_set("g", lambda: "again", 60))
        seen.append(cache.get("g"))
        return seen

    assert asyncio.run(scenario()) == ["v", True, "v", "computed", "computed", True,
                                       "computed", "again", "again"]


def test_an_async_fill_is_invalidated_by_another_client(cache: Any, server: RedisServer) -> None:
    cache.set("k", "old", 60)
    assert asyncio.run(cache.aget("k")) == "old"
    assert held(cache, "k")
    make_cache(server.url).set("k", "new", 60)
    wait_for(lambda: not held(cache, "k"), WAIT, "the invalidation")
    assert asyncio.run(cache.aget("k")) == "new"


# --- 2. other processes' writes arrive through the channel ------------------------------

def test_another_clients_write_drops_the_local_entry(cache: Any, server: RedisServer) -> None:
    cached_locally(cache, "k", "old")
    other = make_cache(server.url)  # another process, as far as Redis can tell
    other.set("k", "new", 60)
    wait_for(lambda: not held(cache, "k"), WAIT, "the invalidation")
    assert cache.get("k") == "new"


def test_flushdb_empties_the_local_cache(cache: Any, server: RedisServer) -> None:
    cached_locally(cache, "k", "old")
    server.client().flushdb()
    wait_for(lambda: len(cache._near.store) == 0, WAIT, "the flush invalidation")
    assert cache.get("k") is None


@pytest.mark.timeout(180)
def test_processes_never_read_an_acknowledged_write_late(server: RedisServer) -> None:
    """Writers bump versions over 1000 keys; readers in other processes, reading through
    their near caches, never see a version older than one acknowledged ``bound`` seconds
    before their read began (generous here; the measured latency is in the benchmark)."""
    keys, bound, seconds = 1000, 1.0, 6.0
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Event(), ctx.Event()
    acked = ctx.Array("q", keys, lock=False)
    results, ready = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=near_workers.writer,
                         args=(server.url, start, stop, acked, keys, ready))]
    procs += [ctx.Process(target=near_workers.reader,
                          args=(server.url, start, stop, acked, keys, bound, results, ready))
              for _ in range(2)]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # spawn + django.setup + a subscribed channel in each
            ready.get(timeout=120)
        start.set()
        time.sleep(seconds)
    finally:
        stop.set()
        start.set()
    outcomes = [results.get(timeout=60) for _ in range(2)]
    for p in procs:
        p.join(30)
    for checks, violations, hits, first in outcomes:
        assert checks > 100, "the reader ran"
        assert hits > 0, "some reads were served from memory"
        assert violations == 0, first


# --- 3. no lost invalidation ------------------------------------------------------------

def test_value_overtaken_during_its_fill_is_not_stored(cache: Any, server: RedisServer) -> None:
    """The race: the GET's answer is on its way while the key changes and the channel
    delivers the invalidation. The old value must not be stored."""
    cache.set("k", "old", 60)
    near = cache._near
    other = make_cache(server.url)
    fill = near._eval

    def eval_then_overtaken(conn: Any, nkey: str) -> Any:
        reply = fill(conn, nkey)
        seq = near.store.ticket()
        other.set("k", "new", 60)
        wait_for(lambda: near.store.ticket() > seq, WAIT, "the invalidation")
        return reply

    near._eval = eval_then_overtaken
    assert cache.get("k") == "old"  # what Redis answered then
    near._eval = fill
    assert not held(cache, "k")
    assert cache.get("k") == "new"


def test_own_write_during_a_fill_wins(cache: Any) -> None:
    """Another thread of this process writes while a fill's answer is in flight."""
    cache.set("k", "old", 60)
    mute(cache)  # only the own-write path may save us
    near = cache._near
    fill = near._eval

    def eval_then_written(conn: Any, nkey: str) -> Any:
        reply = fill(conn, nkey)
        t = threading.Thread(target=cache.set, args=("k", "new", 60))
        t.start()
        t.join()
        return reply

    near._eval = eval_then_written
    assert cache.get("k") == "old"
    near._eval = fill
    assert cache.get("k") == "new"


# --- 4. losing the channel --------------------------------------------------------------

def test_killed_channel_empties_and_bypasses_until_back(cache: Any,
                                                        server: RedisServer) -> None:
    cached_locally(cache, "k", "old")
    listener = cache._near.listener
    epoch = listener.epoch
    server.client().client_kill_filter(_id=listener.client_id)
    wait_for(lambda: listener.epoch > epoch, WAIT, "the loss to be noticed")
    assert not held(cache, "k")
    wait_for(lambda: listener.ready, WAIT, "the channel to come back")
    assert listener.losses == 1
    # Tracking follows the new channel: an entry filled now is invalidated through it.
    assert cache.get("k") == "old"
    assert cache.get("k") == "old"
    assert held(cache, "k")
    make_cache(server.url).set("k", "new", 60)
    wait_for(lambda: not held(cache, "k"), WAIT, "an invalidation on the new channel")
    assert cache.get("k") == "new"


def test_a_refused_tracking_redirect_renews_the_channel(cache: Any) -> None:
    """The read connections reach a server that does not know the channel (here: the
    channel's id is made unknown): the channel is renewed, then tracking works again."""
    listener = cache._near.listener
    cache.set("k", "v", 60)
    cache._near.forget_all()
    cache._near._pool.disconnect()  # fill connections set tracking up again
    listener.client_id = 10**9
    assert cache.get("k") == "v"
    assert not held(cache, "k")
    wait_for(lambda: listener.losses == 1 and listener.ready, WAIT, "a renewed channel")
    assert cache.get("k") == "v"
    assert held(cache, "k")


def test_nothing_is_stored_while_the_channel_is_down(cache: Any, server: RedisServer) -> None:
    listener = cache._near.listener
    listener.lose("test")  # as the thread does when the connection drops
    cache.set("k", "v", 60)
    assert cache.get("k") == "v"
    assert not held(cache, "k")


def test_a_fill_on_a_dropped_pooled_connection_is_sent_again(cache: Any,
                                                            server: RedisServer) -> None:
    """Plain reads survive a dropped pooled socket (redis-py retries them); so do fills."""
    cache.set("k", "v", 60)
    cache.get("k")  # pools a fill connection
    cache._near.forget_all()
    server.client().client_kill_filter(_type="normal")  # not the channel (pubsub)
    assert cache.get("k") == "v"
    assert cache._near.listener.losses == 0


def test_server_restart_empties_the_local_cache(cache: Any, server: RedisServer) -> None:
    cached_locally(cache, "k", "old")
    listener = cache._near.listener
    epoch = listener.epoch
    server.restart()  # no persistence: the data is gone too
    wait_for(lambda: listener.epoch > epoch, WAIT, "the loss to be noticed")
    assert not held(cache, "k")
    wait_for(lambda: listener.ready, WAIT, "the channel to come back")
    assert wait_for(lambda: cache.get("k", "gone") == "gone", WAIT, "a fresh read")
    cached_locally(cache, "k", "after")
    make_cache(server.url).set("k", "newer", 60)
    wait_for(lambda: not held(cache, "k"), WAIT, "an invalidation after the restart")


def test_silent_channel_counts_as_lost(cache: Any, server: RedisServer) -> None:
    """A hung server (SIGSTOP): no PING answer within the limit means bypass."""
    cached_locally(cache, "k", "old")
    server.pause()
    try:
        wait_for(lambda: cache._near.lookup(str(cache.client.make_key("k"))) is None,
                 WAIT, "the silent channel to be given up")
    finally:
        server.resume()
    wait_for(lambda: cache._near.listener.ready, WAIT, "the channel to come back")


# --- 5. lifetimes -----------------------------------------------------------------------

def test_local_entry_expires_with_the_key(cache: Any) -> None:
    mute(cache)  # Redis's own expiry invalidation does not help
    cached_locally(cache, "k", "v", timeout=1)
    wait_for(lambda: not held(cache, "k"), WAIT, "the local entry to expire")
    assert cache.get("k") is None


def test_a_slow_answer_does_not_stretch_the_local_life(cache: Any, server: RedisServer) -> None:
    """The PTTL counts from when Redis ran the read, not from when its answer arrived:
    once the key is gone from Redis, so is the local copy, however late the answer was."""
    mute(cache)
    cache.set("k", "v", 0.6)
    near = cache._near
    fill = near._eval

    def slow_answer(conn: Any, nkey: str) -> Any:
        reply = fill(conn, nkey)
        time.sleep(0.3)  # the answer travels slowly
        return reply

    near._eval = slow_answer
    assert cache.get("k") == "v"
    near._eval = fill
    client = server.client()
    wait_for(lambda: not client.exists(str(cache.client.make_key("k"))), WAIT,
             "the key to expire in Redis", step=0.005)
    assert not held(cache, "k")


def test_touch_shortening_the_ttl_is_followed(cache: Any) -> None:
    cached_locally(cache, "k", "v", timeout=300)
    mute(cache)
    cache.touch("k", 1)
    assert cache.get("k") == "v"
    assert held(cache, "k")
    wait_for(lambda: not held(cache, "k"), WAIT, "the shortened entry to expire")


def test_max_local_ttl_caps_the_local_life(server: RedisServer) -> None:
    cache = near_cache(server.url, {"MAX_LOCAL_TTL": 0.5})
    try:
        mute(cache)
        cached_locally(cache, "k", "v", timeout=300)
        wait_for(lambda: not held(cache, "k"), WAIT, "MAX_LOCAL_TTL")
        assert cache.get("k") == "v"  # still in Redis
    finally:
        cache._near.stop()


def test_stale_get_or_set_value_is_never_served_from_memory(server: RedisServer) -> None:
    cache = near_cache(server.url, STALE_TTL=30, XFETCH_BETA=0)
    try:
        mute(cache)
        assert cache.get_or_set("g", lambda: "first", 1) == "first"
        assert cache.get_or_set("g", lambda: "unused", 1) == "first"
        assert held(cache, "g")
        wait_for(lambda: not held(cache, "g"), WAIT, "the soft expiry")
        assert cache.get("g") is None  # stale-only: a miss for get
        assert cache.get_or_set("g", lambda: "second", 1) == "second"
    finally:
        cache._near.stop()


# --- 6. memory bounds -------------------------------------------------------------------

def test_store_is_an_lru_bounded_by_entries_and_bytes() -> None:
    store = LocalStore(max_entries=3, max_bytes=10_000)
    for i in range(5):
        assert store.put(f"k{i}", b"v", 1e18, store.ticket())
    assert len(store) == 3
    assert store.get("k0", 0) is None
    store.get("k2", 0)  # recently used
    store.put("k5", b"v", 1e18, store.ticket())
    assert store.get("k2", 0) is not None
    assert store.get("k3", 0) is None
    small = LocalStore(max_entries=1000, max_bytes=3 * (ENTRY_OVERHEAD + 2 + 100))
    for i in range(10):
        small.put(f"k{i}", b"x" * 100, 1e18, small.ticket())
    assert len(small) == 3
    assert small.nbytes <= small.max_bytes
    assert not small.put("big", b"x" * 10_000, 1e18, small.ticket())


def test_backend_keeps_max_entries(server: RedisServer) -> None:
    cache = near_cache(server.url, {"MAX_ENTRIES": 10, "MAX_BYTES": 100_000})
    try:
        for i in range(50):
            cache.set(f"k{i}", "x" * 100)
            cache.get(f"k{i}")
        assert len(cache._near.store) == 10
        assert cache._near.store.nbytes <= 100_000
    finally:
        cache._near.stop()


def test_redis_errors_follow_ignore_exceptions(server: RedisServer) -> None:
    cache = near_cache(server.url, IGNORE_EXCEPTIONS=True, SOCKET_TIMEOUT=0.5,
                       SOCKET_CONNECT_TIMEOUT=0.5)
    try:
        server.kill()
        assert cache.get("missing", "fallback") == "fallback"
    finally:
        cache._near.stop()
        server.restart()
    with pytest.raises(redis.RedisError):
        strict = near_cache(server.url)
        try:
            server.kill()
            strict.get("missing")
        finally:
            strict._near.stop()


# --- topologies ------------------------------------------------------------------------

FACTORY = "django_redispatterns.connection.ConnectionFactory"


def topology_cache(url: str, near: bool = True) -> Any:
    from django_redispatterns.cache import RedisCache

    options: dict[str, Any] = {"CONNECTION_FACTORY": FACTORY, "SOCKET_TIMEOUT": 2,
                               "SOCKET_CONNECT_TIMEOUT": 2}
    if near:
        options["NEAR_CACHE"] = {}
    return RedisCache([url], {"KEY_PREFIX": "near-topology", "TIMEOUT": 60,
                              "OPTIONS": options})


@pytest.mark.timeout(180)
def test_sentinel_near_cache_follows_a_failover(
        sentinel_factory: Callable[[], Any]) -> None:
    """Through Sentinel the near cache works as on one server; after a failover the
    channel moves to the new primary: the local cache is emptied, and entries filled
    afterwards are invalidated by writes on the new primary."""
    topology = sentinel_factory()
    cache, other = topology_cache(topology.url), topology_cache(topology.url, near=False)
    try:
        assert cache._near._start().wait_ready(WAIT)
        cached_locally(cache, "k", "before")
        other.set("k", "changed", 60)
        wait_for(lambda: not held(cache, "k"), WAIT, "an invalidation through Sentinel")
        cached_locally(cache, "k", "before")
        listener = cache._near.listener
        topology.failover()
        other.set("k", "after", 60)  # on the new primary
        wait_for(lambda: cache.get("k") == "after", 30, "the new primary's value")
        assert listener.losses >= 1
        wait_for(lambda: listener.ready, WAIT, "the channel on the new primary")
        cached_locally(cache, "k", "after")
        other.set("k", "newest", 60)
        wait_for(lambda: not held(cache, "k"), WAIT, "an invalidation on the new primary")
        assert cache.get("k") == "newest"
    finally:
        cache._near.stop()
