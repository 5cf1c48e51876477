"""Session loads from process memory (``SESSIONS["NEAR_CACHE"]``): fast, and never stale
past the bound.

Each test runs on a throwaway redis-server of its own. What is claimed: a held session is
loaded without asking Redis; any change of its record — made by another process or
another connection — reaches every process through Redis tracking, and at worst within
``SILENT_LIMIT`` seconds, because a channel that has not been heard from for that long
(killed, server hung or restarted) stops the copies being served; this process's own
writes are read back at once. Bounds are asserted with a generous margin, never a speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import override_settings

from django_redispatterns.checks.configuration import check_settings
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.sessions import (
    SessionStore,
    SessionStoreUnavailable,
    logout_everywhere,
    memory,
)
from django_redispatterns.sessions.keyspace import keys_of
from tests import session_memory_worker as worker
from tests.commanded import Commanded
from tests.redis_servers import KEY_PREFIX, RedisServer
from tests.topologies import wait_for

MARGIN = 1.5  # seconds on top of the bound, for a loaded 2-core machine
WAIT = 10.0

pytestmark = pytest.mark.topology


def settings_for(server: RedisServer, near: Any = True) -> dict[str, Any]:
    return {"CONNECTION": server.url, "KEY_PREFIX": KEY_PREFIX, "SOCKET_TIMEOUT": 0.5,
            "SOCKET_CONNECT_TIMEOUT": 0.5, "SESSIONS": {"NEAR_CACHE": near}}


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    node = redis_server_factory()
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions",
                           REDIS_PATTERNS=settings_for(node)):
        yield node
        memory.stop()
    if node.process is not None and node.process.poll() is None:
        node.resume()
        client = node.client()
        for key in client.scan_iter(match=f"{KEY_PREFIX}:*"):  # every key has a TTL
            assert client.pttl(key) > 0, key


def sign_in(user_id: str = "7", **data: Any) -> str:
    store = SessionStore()
    store[SESSION_KEY] = user_id
    for name, value in data.items():
        store[name] = value
    store.save()
    assert store.session_key is not None
    return store.session_key


def loaded(session_key: str) -> dict[str, Any]:
    return SessionStore(session_key).load()


def held(session_key: str) -> bool:
    near = memory.memory()
    assert near is not None
    return near.reads.lookup(keys_of(session_key)[0]) is not None


def hold(session_key: str) -> memory.SessionMemory:
    """Load ``session_key`` until this process holds it (the channel subscribes first)."""
    wait_for(lambda: bool(loaded(session_key)) and held(session_key), WAIT,
             "the session to be held in memory")
    near = memory.memory()
    assert near is not None
    return near


def hmget_calls(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def gone_within(session_key: str, seconds: float) -> float | None:
    """Seconds until a load that began then found ``session_key`` gone (None: never)."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        began = time.monotonic()
        if not loaded(session_key):
            return began - started
        time.sleep(0.005)
    return None


def stays_gone(session_key: str, near: memory.SessionMemory) -> None:
    """Once the channel is back, loads still find ``session_key`` gone (no old copy)."""
    listener = near.reads.listener
    assert listener is not None
    wait_for(lambda: listener.ready, WAIT, "the channel to subscribe again")
    for _ in range(20):
        assert loaded(session_key) == {}
        time.sleep(0.01)


# --- the hit path ------------------------------------------------------------------------


def test_a_held_session_loads_without_asking_redis(server: RedisServer) -> None:
    key = sign_in(cart="3 books")
    hold(key)
    before = hmget_calls(server)
    for _ in range(50):
        assert loaded(key) == {SESSION_KEY: "7", "cart": "3 books"}
    assert hmget_calls(server) == before


def test_off_by_default_every_load_asks_redis(server: RedisServer) -> None:
    with override_settings(REDIS_PATTERNS=settings_for(server, near=None)):
        key = sign_in()
        before = hmget_calls(server)
        for _ in range(5):
            assert loaded(key)[SESSION_KEY] == "7"
        assert hmget_calls(server) == before + 5
        assert memory.memory() is None


def test_aload_is_served_from_memory_too(server: RedisServer) -> None:
    import asyncio

    key = sign_in()
    hold(key)
    before = hmget_calls(server)
    assert asyncio.run(SessionStore(key).aload())[SESSION_KEY] == "7"
    assert hmget_calls(server) == before


# --- other writers: the bound ----------------------------------------------------------


def test_logout_everywhere_reaches_another_process_within_the_bound(
        server: RedisServer) -> None:
    reader = Commanded(worker.reader, settings_for(server))
    try:
        keys = [sign_in("42"), sign_in("42")]
        for key in keys:
            assert reader.call("fill", key) == "42"
        for _ in range(3):  # three rounds: a revocation is never served past the bound
            revoked_at = time.monotonic()
            assert logout_everywhere("42") == len(keys)
            for key in keys:
                seen = reader.call("watch", key, memory.SILENT_LIMIT + MARGIN + 5)
                assert seen["gone_at"] is not None, "a revoked session was still served"
                assert seen["gone_at"] - revoked_at <= memory.SILENT_LIMIT + MARGIN, seen
            keys = [sign_in("42"), sign_in("42")]
            for key in keys:
                assert reader.call("fill", key) == "42"
    finally:
        reader.close()


def test_a_change_by_another_connection_drops_the_copy(server: RedisServer) -> None:
    key = sign_in()
    hold(key)
    server.client().delete(keys_of(key)[0])  # not through this process: only Redis tells
    lag = gone_within(key, memory.SILENT_LIMIT + MARGIN + 5)
    assert lag is not None and lag <= memory.SILENT_LIMIT + MARGIN
    stays_gone(key, memory.memory())  # type: ignore[arg-type]


def test_a_session_expiring_in_redis_is_not_served_after_its_ttl(server: RedisServer) -> None:
    """Even when Redis is slow to expire it (no active expiry here: no message comes until
    something reads the key), a copy dies with the TTL it had when it was read."""
    server.client().execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    store = SessionStore()
    store[SESSION_KEY] = "7"
    store.set_expiry(1)
    store.save()
    key = store.session_key
    assert key is not None
    hold(key)
    expires = time.monotonic() + 1.0
    while time.monotonic() < expires - 0.3:
        assert loaded(key)
    time.sleep(max(0.0, expires - time.monotonic()))
    lag = gone_within(key, memory.SILENT_LIMIT + MARGIN + 5)
    assert lag is not None and lag <= MARGIN


def test_max_local_ttl_bounds_a_copy(server: RedisServer) -> None:
    with override_settings(REDIS_PATTERNS=settings_for(server, {"MAX_LOCAL_TTL": 0.2})):
        key = sign_in()
        hold(key)
        time.sleep(0.5)
        assert not held(key)


# --- this process's own writes -------------------------------------------------------------


def deaf(near: memory.SessionMemory) -> None:
    """Ignore what the channel hears from now on: only this process's own bookkeeping
    can then keep its loads fresh."""
    listener = near.reads.listener
    assert listener is not None
    listener._invalidate = lambda keys: None  # type: ignore[union-attr]


def test_own_save_is_read_back_at_once(server: RedisServer) -> None:
    key = sign_in(n=0)
    deaf(hold(key))
    for n in range(1, 30):
        store = SessionStore(key)
        store["n"] = n
        store.save()
        assert loaded(key)["n"] == n


def test_own_delete_and_logout_everywhere_are_seen_at_once(server: RedisServer) -> None:
    key = sign_in()
    deaf(hold(key))
    SessionStore(key).delete()
    assert loaded(key) == {}
    key = sign_in("8")
    deaf(hold(key))
    logout_everywhere("8")
    assert loaded(key) == {}


def test_loads_racing_logout_everywhere_in_threads_never_see_it_afterwards(
        server: RedisServer) -> None:
    """Eight threads load one session in a loop; no load that began after
    ``logout_everywhere`` returned finds it (fills in flight are refused)."""
    key = sign_in("9")
    hold(key)
    seen: list[tuple[float, bool]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def load_loop() -> None:
        try:
            while not stop.is_set():
                began = time.monotonic()
                seen.append((began, bool(loaded(key))))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=load_loop) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    logout_everywhere("9")
    returned = time.monotonic()
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    late = [began for began, found in seen if found and began > returned]
    assert late == []
    assert any(found for _, found in seen) and any(began > returned for began, _ in seen)


# --- faults ---------------------------------------------------------------------------------


def channel_id(near: memory.SessionMemory) -> int:
    listener = near.reads.listener
    assert listener is not None and listener.client_id is not None
    return int(listener.client_id)


def test_channel_killed_drops_every_copy_and_a_change_is_seen(server: RedisServer) -> None:
    key = sign_in()
    near = hold(key)
    server.client().client_kill_filter(_id=channel_id(near))
    server.client().delete(keys_of(key)[0])
    lag = gone_within(key, memory.SILENT_LIMIT + MARGIN + 5)
    assert lag is not None and lag <= memory.SILENT_LIMIT + MARGIN
    stays_gone(key, near)
    assert near.reads.listener is not None and near.reads.listener.losses >= 1


def test_fill_connection_killed_a_change_is_still_seen(server: RedisServer) -> None:
    key = sign_in()
    near = hold(key)
    admin = server.client()
    tracking = [int(c["id"]) for c in admin.client_list() if "t" in c["flags"]]
    assert tracking
    for client_id in tracking:
        admin.client_kill_filter(_id=client_id)
    admin.delete(keys_of(key)[0])  # Redis forgot the tracking: no message comes
    lag = gone_within(key, memory.SILENT_LIMIT + MARGIN + 5)
    assert lag is not None and lag <= memory.SILENT_LIMIT + MARGIN
    stays_gone(key, near)


def test_server_hung_copies_stop_being_served_within_the_bound(server: RedisServer) -> None:
    key = sign_in()
    hold(key)
    server.pause()
    try:
        time.sleep(memory.SILENT_LIMIT + MARGIN)
        with pytest.raises(SessionStoreUnavailable):
            loaded(key)
    finally:
        server.resume()
    wait_for(lambda: loaded(key).get(SESSION_KEY) == "7", WAIT, "loads after the resume")


def test_server_restarted_without_the_session_it_is_gone(server: RedisServer) -> None:
    key = sign_in()
    near = hold(key)
    server.restart()  # no persistence: every session is gone
    lag = None
    deadline = time.monotonic() + memory.SILENT_LIMIT + MARGIN + 10
    while lag is None and time.monotonic() < deadline:
        try:
            lag = gone_within(key, 1.0)
        except SessionStoreUnavailable:  # still starting
            time.sleep(0.05)
    assert lag is not None, "a session of a restarted, empty server was still served"
    stays_gone(key, near)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "error"), [
    ("yes", "must be bool or dict or None"),
    ({"MAX_ENTRIES": 0}, "MAX_ENTRIES"),
    ({"MAX_LOCAL_TTL": -1}, "MAX_LOCAL_TTL"),
    ({"PREFIXES": ["a"]}, "unknown keys ['PREFIXES']"),
])
def test_a_malformed_setting_is_refused_by_name(server: RedisServer, value: Any,
                                                error: str) -> None:
    with override_settings(REDIS_PATTERNS=settings_for(server, value)):
        with pytest.raises(ConfigurationError, match="SESSIONS'\\]\\['NEAR_CACHE'\\]") as exc:
            memory.memory()
        assert error in str(exc.value)
        messages = [m for m in check_settings() if m.id.endswith("E002")]
        assert messages and error in messages[0].msg


# --- Sentinel and Cluster ---------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["sentinel_url", "cluster_url"])
def test_on_sentinel_and_cluster_copies_are_served_and_dropped_by_redis(
        topology: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Users on several Cluster slots (and masters); this process's own bookkeeping is
    switched off, so only Redis's messages can drop the copies."""
    from tests.topology_fixtures import use_connection

    url = request.getfixturevalue(topology)
    with use_connection(url, SESSIONS={"NEAR_CACHE": True}):
        try:
            keys = {str(user): sign_in(str(user)) for user in range(6)}
            for key in keys.values():
                hold(key)
            for key in keys.values():
                assert loaded(key)
            monkeypatch.setattr(memory, "forget", lambda keys: None)
            monkeypatch.setattr(memory, "forget_all", lambda: None)
            for user, key in keys.items():
                logout_everywhere(user)
                lag = gone_within(key, memory.SILENT_LIMIT + MARGIN + 5)
                assert lag is not None and lag <= memory.SILENT_LIMIT + MARGIN
        finally:
            memory.stop()


def test_the_channel_survives_being_closed_from_another_thread_mid_read(
        server: RedisServer) -> None:
    """``renew()`` (a Sentinel failover, a refused redirect) closes the channel's socket
    while its thread waits in a read of a hung server; however redis-py reports that, the
    thread subscribes again once the server answers."""
    key = sign_in()
    near = hold(key)
    listener = near.reads.listener
    assert listener is not None
    server.pause()
    try:
        listener.renew("closed by the test")  # the thread reconnects, then waits on a reply
        time.sleep(0.5)
        listener.renew("closed by the test, mid-read")
        time.sleep(0.3)
    finally:
        server.resume()
    assert listener._thread.is_alive()  # type: ignore[union-attr]
    wait_for(lambda: listener.ready, WAIT, "the channel to subscribe again")
    hold(key)
