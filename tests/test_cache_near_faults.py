"""The near cache's 3 s bound under connection faults, with a reader and a writer in
separate processes on a private redis-server.

A local copy is tied to the connection that filled it: Redis stops tracking a key when
that connection closes, so whatever closes it — ``CLIENT KILL``, the server's idle
``timeout``, a fill that raised, a fill that timed out — the copy must go with it. A
channel lagging behind a burst of invalidations must count as lost. Event loops that
come and go must not leave connections behind.

Each test fills a hot key in the reader, causes the fault, writes a new value from this
process and asserts the reader reads it within the bound plus a generous margin (it is
never asserted faster: the machine is shared).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_redispatterns.tracking.listener import SILENT_LIMIT
from tests import near_fault_workers as workers
from tests.commanded import Commanded
from tests.redis_servers import RedisServer
from tests.test_cache_support import make_cache
from tests.topologies import wait_for

MARGIN = 1.5  # seconds on top of the bound, for a loaded 2-core machine
WATCH = 8.0  # how long the reader keeps reading before giving up


class Reader(Commanded):
    """The reader process: ``call(cmd, *args)`` runs a command of
    :mod:`tests.near_fault_workers` there and returns its answer."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(workers.reader, url, options)


@pytest.fixture
def start_reader() -> Iterator[Callable[..., Reader]]:
    readers: list[Reader] = []

    def start(url: str, **options: Any) -> Reader:
        readers.append(Reader(url, **options))
        return readers[-1]

    yield start
    for reader in readers:
        reader.close()


def fill_connections(server: RedisServer) -> list[int]:
    """Ids of the connections with tracking on (the reader's fill connections)."""
    return [int(c["id"]) for c in server.client().client_list() if "t" in c["flags"]]


def write_then_watch(server: RedisServer, reader: Reader, key: str) -> dict[str, Any]:
    """Write ``key`` = 2 from this process, then let the reader read it until it sees 2."""
    workers.make(server.url, near=False).set(key, 2)
    written = time.monotonic()
    return reader.call("watch", key, 2, written, WATCH, timeout=WATCH + 30)


def assert_within_bound(seen: dict[str, Any]) -> None:
    assert seen["seen_after"] is not None, f"the new value was never read ({seen})"
    assert seen["seen_after"] <= SILENT_LIMIT + MARGIN, seen


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()


def hot(server: RedisServer, reader: Reader, key: str = "hot") -> None:
    workers.make(server.url, near=False).set(key, 1)
    assert reader.call("fill", key) == 1


# --- A. the connection that filled a key closes -----------------------------------------

@pytest.mark.parametrize("kill", ["id", "type normal"])
def test_killed_fill_connection_drops_what_it_filled(
        server: RedisServer, start_reader: Callable[..., Reader], kill: str) -> None:
    reader = start_reader(server.url)
    hot(server, reader)
    ids = fill_connections(server)
    assert ids, "the fill connection tracks"
    client = server.client()
    if kill == "id":
        for client_id in ids:
            client.client_kill_filter(_id=client_id)
    else:
        client.client_kill_filter(_type="normal", skipme=True)
    assert_within_bound(write_then_watch(server, reader, "hot"))


def test_fill_connection_closed_by_the_servers_idle_timeout(
        redis_server_factory: Callable[..., RedisServer],
        start_reader: Callable[..., Reader]) -> None:
    server = redis_server_factory("--timeout", "1")
    reader = start_reader(server.url)
    hot(server, reader)
    # every hit is local: the fill connection idles until the server closes it
    deadline = time.monotonic() + 15
    while fill_connections(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not fill_connections(server), "the server closed the idle fill connection"
    assert_within_bound(write_then_watch(server, reader, "hot"))


def test_a_fill_that_raises_drops_what_its_connection_filled(
        server: RedisServer, start_reader: Callable[..., Reader]) -> None:
    reader = start_reader(server.url)
    hot(server, reader)
    client = server.client()
    client.hset(f"{workers.PREFIX}:1:a-hash", "field", "value")  # GET of it: WRONGTYPE
    client.expire(f"{workers.PREFIX}:1:a-hash", 60)
    assert reader.call("get", "a-hash") == ("error", "ResponseError")
    assert_within_bound(write_then_watch(server, reader, "hot"))


def test_a_fill_timing_out_on_a_hung_server_drops_what_its_connection_filled(
        server: RedisServer, start_reader: Callable[..., Reader]) -> None:
    reader = start_reader(server.url, SOCKET_TIMEOUT=0.5)
    hot(server, reader)
    ids = set(fill_connections(server))
    # Hung just past the fill's socket timeout, well within the channel's limit, so the
    # channel stays (a longer hang would bypass the local cache for another reason).
    server.pause()
    try:
        assert reader.call("get", "missing") == ("error", "TimeoutError")
    finally:
        server.resume()
    wait_for(lambda: not ids & set(fill_connections(server)), 10,
             "the server to see the timed-out fill connection closed")
    seen = write_then_watch(server, reader, "hot")
    assert reader.call("losses") == 0, "the channel itself was never lost"
    assert_within_bound(seen)


# --- B. a channel lagging behind a burst ------------------------------------------------

def test_a_channel_lagging_behind_a_burst_is_bypassed_within_the_bound(
        server: RedisServer, start_reader: Callable[..., Reader]) -> None:
    burst = [f"{workers.PREFIX}:burst:{i}" for i in range(110_000)]
    reader = start_reader(server.url)
    assert reader.call("track_many", burst, timeout=120) == len(burst)
    hot(server, reader)
    client = server.client()
    # One transaction: every invalidation is queued for the channel at once, the hot
    # key's last.
    client.eval("for i, key in ipairs(KEYS) do redis.call('SET', key, '1', 'EX', 60) end",
                len(burst), *burst)
    assert_within_bound(write_then_watch(server, reader, "hot"))


# --- C. event-loop churn ----------------------------------------------------------------

def test_an_event_loop_per_aget_leaves_no_connections_behind(
        server: RedisServer, start_reader: Callable[..., Reader]) -> None:
    reader = start_reader(server.url)
    workers.make(server.url, near=False).set("k", 1)
    assert reader.call("aget_loops", "k", 3) == 3
    before = len(server.client().client_list())
    assert reader.call("aget_loops", "k", 30) == 30
    after = len(server.client().client_list())
    assert after <= before + 1, f"{before} connections before 30 event loops, {after} after"


# --- the bookkeeping stays bounded ------------------------------------------------------

def test_keys_noted_per_fill_connection_stay_bounded(server: RedisServer) -> None:
    """A long-lived fill connection reads many keys: it remembers about as many as the
    local cache can hold, not every key it ever read."""
    cache = make_cache(server.url)
    near = make_cache(server.url, NEAR_CACHE={"MAX_ENTRIES": 5})
    try:
        for i in range(40):
            cache.set(f"k{i}", i)
            assert near.get(f"k{i}") == i
        conns = list(near._near.fills._conns)
        assert conns and all(len(c.rp_keys) <= 2 * 5 + 1 for c in conns), [
            len(c.rp_keys) for c in conns]
    finally:
        near._near.stop()


def test_a_fill_connection_collected_without_a_close_empties_the_local_cache(
        server: RedisServer) -> None:
    """Its socket closes with it (Redis forgets what it tracked); the collector may run
    anywhere, so the channel's thread empties the local cache at its next sweep."""
    import gc

    near = make_cache(server.url, NEAR_CACHE={})
    try:
        assert near._near._start().wait_ready(10)
        make_cache(server.url).set("k", 1)
        assert near.get("k") == 1
        nkey = str(near.client.make_key("k"))
        assert near._near.lookup(nkey) is not None
        pool = near._near._pool
        with pool._lock:  # the pool forgets it without closing it (as a reset does)
            conns, pool._available_connections = pool._available_connections, []
        del conns
        gc.collect()
        deadline = time.monotonic() + 10
        while near._near.lookup(nkey) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert near._near.lookup(nkey) is None
    finally:
        near._near.stop()
