"""``resend=False`` clients (the "retries off" remedy for silent re-sends): a call that timed out is
never sent again, on URL connections and on django-redis CACHES aliases, sync and async."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from django_redispatterns import connection
from tests.redis_servers import KEY_PREFIX, RedisServer
from tests.topologies import SentinelTopology
from tests.topology_fixtures import patterns_settings

# The call whose copies the tests count: one INCR (with a TTL) per run on the server.
INCR = "local n = redis.call('INCR', KEYS[1]); redis.call('PEXPIRE', KEYS[1], 60000); return n"


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    yield redis_server_factory()


def settings_for(server: RedisServer) -> Any:
    # A URL of its own (client_name): django-redis shares pools per URL across the process.
    url = f"{server.url}?socket_timeout=0.3&client_name=resend-{uuid.uuid4().hex[:8]}"
    return override_settings(
        CACHES={**settings.CACHES, "resend": {
            "BACKEND": "django_redis.cache.RedisCache", "LOCATION": url,
            # django-redis's own client, set to re-send timed-out calls: for up to ~8 s, so
            # that it re-sends once the stopped server is back even on a loaded machine
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {
                "retry": Retry(ConstantBackoff(0.1), 20), "retry_on_timeout": True,
                "retry_on_error": [redis.TimeoutError]}}}},  # redis-py 5 needs the list
        REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                        "SOCKET_TIMEOUT": 0.3, "SOCKET_CONNECT_TIMEOUT": 1},
    )


# The server resumes when it sees a client hang up on it; on a loaded machine an unrelated
# connection closing can resume it before the call timed out. The call then simply succeeds
# (once): the scenario did not happen, so it is tried again; a re-send fails at once.
ATTEMPTS = 3


def runs(server: RedisServer, client: Any) -> tuple[int, BaseException | None]:
    """Send INCR once through ``client`` while the server is stopped, so that the call times
    out (0.3 s); then how many times the server ran it, and what the call raised."""
    key = f"{KEY_PREFIX}:resend:{uuid.uuid4().hex}"
    error: BaseException | None = None
    with server.stopped_until_a_client_gives_up():
        try:
            client.eval(INCR, 1, key)
        except redis.RedisError as exc:
            error = exc
    return settle(server.client(), key), error


async def aruns(server: RedisServer, client: Any) -> tuple[int, BaseException | None]:
    key = f"{KEY_PREFIX}:resend:{uuid.uuid4().hex}"
    error: BaseException | None = None
    with server.stopped_until_a_client_gives_up() as hung_up:
        try:
            await client.eval(INCR, 1, key)
        except redis.RedisError as exc:
            error = exc
        await asyncio.to_thread(hung_up.wait, 30)  # the loop closes the socket meanwhile
    return settle(server.client(), key), error


def settle(admin: redis.Redis, key: str) -> int:
    """The counter once every copy of the call has run: all were sent before the call
    returned, and the running server reads them at once."""
    deadline = time.monotonic() + 10
    while True:
        first = int(admin.get(key) or 0)
        time.sleep(0.5)
        if first and int(admin.get(key) or 0) == first:
            return first
        assert time.monotonic() < deadline, "the timed-out call never ran"


@pytest.mark.parametrize("conn", ["url", "alias"])
def test_sync_client_without_resend_runs_a_timed_out_call_once(
        server: RedisServer, conn: str) -> None:
    with settings_for(server):
        name = server.url if conn == "url" else "resend"
        client = connection.client_for(name, resend=False)
        assert client is connection.client_for(name, resend=False)  # built once
        assert client.ping()
        for _attempt in range(ATTEMPTS):
            count, error = runs(server, client)
            assert count == 1  # the call ran once: it was never sent again
            if isinstance(error, redis.TimeoutError):
                break
    assert isinstance(error, redis.TimeoutError)  # the caller learns of the timeout


@pytest.mark.parametrize("conn", ["url", "alias"])
def test_async_client_without_resend_runs_a_timed_out_call_once(
        server: RedisServer, conn: str) -> None:
    async def run() -> tuple[int, BaseException | None]:
        name = server.url if conn == "url" else "resend"
        client = connection.async_client_for(name, resend=False)
        try:
            assert await client.ping()
            for _attempt in range(ATTEMPTS):
                count, error = await aruns(server, client)
                assert count == 1  # the call ran once: it was never sent again
                if isinstance(error, redis.TimeoutError):
                    break
            return count, error
        finally:
            await client.aclose()

    with settings_for(server):
        count, error = asyncio.run(run())
    assert isinstance(error, redis.TimeoutError)
    assert count == 1


def test_feature_client_without_resend_is_a_separate_client(server: RedisServer) -> None:
    with settings_for(server), override_settings(REDIS_PATTERNS={
            "CONNECTION": "default", "RATELIMIT": {"CONNECTION": "resend"}}):
        plain = connection.get_client("RATELIMIT")
        once = connection.get_client("RATELIMIT", resend=False)
        assert once is not plain and once is connection.get_client("RATELIMIT", resend=False)
        assert once.connection_pool is not plain.connection_pool
        # same server, same options otherwise
        kwargs = once.connection_pool.connection_kwargs
        assert kwargs["port"] == server.port
        assert kwargs["socket_timeout"] == plain.connection_pool.connection_kwargs[
            "socket_timeout"]


def test_the_aliases_own_client_does_resend(server: RedisServer) -> None:
    """The control: the alias's django-redis client (retry_on_timeout) re-sends a timed-out
    call, so the tests above would catch a client that does."""
    with settings_for(server):
        client = connection.client_for("resend")
        assert client.ping()
        for _attempt in range(ATTEMPTS):  # an unrelated hang-up may resume the server early
            count, _ = runs(server, client)
            if count > 1:
                break
    assert count > 1


def test_sentinel_clients_without_resend(redis_sentinel: SentinelTopology,
                                         sentinel_url: str) -> None:
    """django-redis's own Sentinel alias and our redis+sentinel:// URL: the resend=False
    client talks to the primary with zero retries."""
    native = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "native": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{redis_sentinel.service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", s.port) for s in redis_sentinel.sentinels],
                "SOCKET_TIMEOUT": 2,
                "CONNECTION_POOL_KWARGS": {"retry_on_timeout": True},
            },
        },
    }
    connection.reset_clients()
    try:
        with override_settings(CACHES=native, REDIS_PATTERNS=patterns_settings("native")):
            for name in ("native", sentinel_url):
                client = connection.client_for(name, resend=False)
                assert client.set(f"{KEY_PREFIX}:resend:sentinel", "1", px=60000)
                assert client.info("replication")["role"] == "master"
                pool = client.connection_pool
                conn = pool.get_connection("PING") if redis.VERSION < (6,) else \
                    pool.get_connection()
                try:
                    assert conn.retry.get_retries() == 0
                    assert not conn.retry_on_error and not conn.retry_on_timeout
                finally:
                    pool.release(conn)
    finally:
        connection.reset_clients()


def test_cluster_client_without_resend_is_the_cluster_client(cluster_url: str) -> None:
    """Cluster clients never re-send (see connection._cluster); resend=False keeps that."""
    connection.reset_clients()
    try:
        client = connection.client_for(cluster_url, resend=False)
        assert connection.is_cluster(client)
        assert client.retry.get_retries() == 0
        assert client.set(f"{KEY_PREFIX}:resend:cluster", "1", px=60000)
    finally:
        connection.reset_clients()
