"""``resend=False`` clients (SPEC D4's "retries off" remedy): a call that timed out is
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
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redispatterns import connection
from tests.redis_servers import KEY_PREFIX, SLOW_INCR_LUA, RedisServer
from tests.topologies import SentinelTopology
from tests.topology_fixtures import patterns_settings

# INCR a counter, then stay busy well past the client's socket timeout (0.3 s).
SLOW_INCR, BUSY_MS = SLOW_INCR_LUA, 700


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    yield redis_server_factory()


def settings_for(server: RedisServer) -> Any:
    # A URL of its own (client_name): django-redis shares pools per URL across the process.
    url = f"{server.url}?socket_timeout=0.3&client_name=resend-{uuid.uuid4().hex[:8]}"
    return override_settings(
        CACHES={**settings.CACHES, "resend": {
            "BACKEND": "django_redis.cache.RedisCache", "LOCATION": url,
            # django-redis's own client re-sends timed-out calls (up to 3 times)
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {
                "retry": Retry(NoBackoff(), 3), "retry_on_timeout": True,
                "retry_on_error": [redis.TimeoutError]}}}},  # redis-py 5 needs the list
        REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                        "SOCKET_TIMEOUT": 0.3, "SOCKET_CONNECT_TIMEOUT": 1},
    )


def runs(server: RedisServer, client: Any) -> int:
    """Send SLOW_INCR once through ``client``; how many times the server ran it."""
    admin = server.client()
    key = f"{KEY_PREFIX}:resend:{uuid.uuid4().hex}"
    with pytest.raises(redis.TimeoutError):
        client.eval(SLOW_INCR, 1, key, BUSY_MS)
    return settle(admin, key)


async def aruns(server: RedisServer, client: Any) -> int:
    admin = server.client()
    key = f"{KEY_PREFIX}:resend:{uuid.uuid4().hex}"
    with pytest.raises(redis.TimeoutError):
        await client.eval(SLOW_INCR, 1, key, BUSY_MS)
    return settle(admin, key)


def settle(admin: redis.Redis, key: str) -> int:
    """The counter once every copy of the call that reached the server has run."""
    deadline = time.monotonic() + 10
    while True:  # a queued re-send runs only after the busy script before it
        try:
            first = int(admin.get(key) or 0)
            time.sleep(1.5)  # longer than one script run: a queued copy would show
            if int(admin.get(key) or 0) == first:
                return first
        except redis.RedisError:  # BUSY / timeout while a copy runs
            pass
        assert time.monotonic() < deadline


@pytest.mark.parametrize("conn", ["url", "alias"])
def test_sync_client_without_resend_runs_a_timed_out_call_once(
        server: RedisServer, conn: str) -> None:
    with settings_for(server):
        name = server.url if conn == "url" else "resend"
        client = connection.client_for(name, resend=False)
        assert client is connection.client_for(name, resend=False)  # built once
        assert client.ping()
        assert runs(server, client) == 1


@pytest.mark.parametrize("conn", ["url", "alias"])
def test_async_client_without_resend_runs_a_timed_out_call_once(
        server: RedisServer, conn: str) -> None:
    async def run() -> int:
        name = server.url if conn == "url" else "resend"
        client = connection.async_client_for(name, resend=False)
        try:
            return await aruns(server, client)
        finally:
            await client.aclose()

    with settings_for(server):
        assert asyncio.run(run()) == 1


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
        assert runs(server, connection.client_for("resend")) > 1


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
