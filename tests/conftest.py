"""Shared fixtures: a real Redis (never a mock), key cleanup, extra servers on demand."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from tests.redis_servers import SKIP_REASON, RedisServer, main_redis_url

# Cluster and Sentinel fixtures (redis_cluster, cluster_settings, sentinel_factory, ...).
pytest_plugins = ["tests.topology_fixtures"]

# Every key the suite writes starts with one of these (see tests/settings.py).
TEST_PREFIXES = ("rptest", ":1:rptest", "rptest-cache")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis this run uses; skips the test when there is none."""
    url = main_redis_url()
    if url is None:
        pytest.skip(SKIP_REASON)
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {url} is not reachable: {exc}")
    return url


def delete_test_keys(client: redis.Redis) -> None:
    """UNLINK every key under the test prefixes (SCAN, never KEYS or FLUSHDB)."""
    for prefix in TEST_PREFIXES:
        batch = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A raw client on the test Redis; the test's keys are removed before and after."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    delete_test_keys(client)
    yield client
    delete_test_keys(client)
    client.close()


@pytest.fixture(autouse=True)
def _every_key_has_a_ttl(request: pytest.FixtureRequest) -> Iterator[None]:
    """House rule I1, checked after every test: no key the app wrote lacks a TTL.

    Scans ``rptest:*`` (the app's KEY_PREFIX in tests/settings.py) on the main test Redis,
    then removes every test key. A test that writes TTL-less keys on purpose (e.g. the
    audit's fixtures) says so with ``@pytest.mark.allow_no_ttl``.
    """
    yield
    url = main_redis_url()
    if url is None:
        return
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        if request.node.get_closest_marker("allow_no_ttl") is None:
            eternal = [
                key for key in client.scan_iter(match="rptest:*", count=1000)
                if client.pttl(key) == -1
            ]
            assert not eternal, f"keys written without a TTL (house rule I1): {eternal[:10]}"
        delete_test_keys(client)
    except redis.RedisError:
        pass  # the test broke the main server on purpose; nothing to check
    finally:
        client.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start throwaway redis-server processes (for faults); all are stopped afterwards."""
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        try:
            server = RedisServer(*args)
        except RuntimeError as exc:
            pytest.skip(str(exc))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def pytest_report_header() -> str:
    return f"redis: {main_redis_url() or 'none (' + SKIP_REASON + ')'}"
