"""pytest fixtures for Cluster and Sentinel topologies (loaded from conftest as a plugin).

* ``redis_cluster`` / ``redis_sentinel`` — session-scoped, one per xdist worker (free ports,
  so workers never share servers); reused by every topology test of that worker.
* ``cluster_url`` / ``sentinel_url`` — the URL for ``REDIS_PATTERNS["CONNECTION"]``; the
  cluster is flushed before the test (it is this worker's own) and checked for TTL-less
  test keys after it (every key the app writes has a TTL; on every master).
* ``cluster_settings`` / ``sentinel_settings`` — ``override_settings`` pointing the whole app
  (and the ``default`` cache, when it can) at the topology.
* ``cluster_factory`` / ``sentinel_factory`` — fresh topologies a fault test may break
  (kill a master, fail over); stopped after the test.

Tests using them are marked ``topology`` (automatically) and skip only when no suitable
``redis-server`` exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_redispatterns import connection
from tests.redis_servers import own_keys
from tests.topologies import ClusterTopology, SentinelTopology, topology_skip_reason

TOPOLOGY_FIXTURES = {
    "redis_cluster", "redis_sentinel", "cluster_url", "sentinel_url", "cluster_settings",
    "sentinel_settings", "cluster_factory", "sentinel_factory",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if TOPOLOGY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.topology)


def _require_topologies() -> None:
    reason = topology_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterTopology]:
    """A 3-master Redis Cluster private to this worker (no replicas: nothing here fails over)."""
    _require_topologies()
    cluster = ClusterTopology(masters=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelTopology]:
    """Primary + replica + 3 sentinels private to this worker.

    Tests may run a graceful ``SENTINEL FAILOVER`` on it (roles swap, the set stays
    healthy); anything that kills a node uses ``sentinel_factory`` instead.
    """
    _require_topologies()
    sentinel = SentinelTopology()
    yield sentinel
    sentinel.stop()


def assert_every_key_has_a_ttl(keys_with_ttl: list[tuple[bytes, int]]) -> None:
    eternal = [key for key, pttl in keys_with_ttl if pttl == -1]
    assert not eternal, f"keys written without a TTL (every key needs one): {eternal[:10]}"


def keys_with_ttl(client: Any) -> list[tuple[bytes, int]]:
    """This worker's test keys on one node, with their PTTL."""
    return [(key, client.pttl(key)) for key in own_keys(client)]


def cluster_keys_with_ttl(cluster: ClusterTopology) -> list[tuple[bytes, int]]:
    return [pair for node in cluster.masters() for pair in keys_with_ttl(node.client())]


@pytest.fixture
def cluster_url(redis_cluster: ClusterTopology, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the worker's cluster, emptied before the test; TTLs checked after it."""
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    yield redis_cluster.url
    if request.node.get_closest_marker("allow_no_ttl") is None:
        assert_every_key_has_a_ttl(cluster_keys_with_ttl(redis_cluster))


@pytest.fixture
def sentinel_url(redis_sentinel: SentinelTopology,
                 request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the worker's Sentinel set, primary emptied before the test; TTLs checked after."""
    redis_sentinel.wait_healthy()
    redis_sentinel.primary().client().flushall()
    yield redis_sentinel.url
    if request.node.get_closest_marker("allow_no_ttl") is None:
        assert_every_key_has_a_ttl(keys_with_ttl(redis_sentinel.primary().client()))


def patterns_settings(url: str, **extra: Any) -> dict[str, Any]:
    """``REDIS_PATTERNS`` for the tests, pointed at ``url``."""
    from django.conf import settings

    base = dict(settings.REDIS_PATTERNS)
    base.update({"CONNECTION": url, **extra})
    return base


@contextlib.contextmanager
def use_connection(url: str, **extra: Any) -> Iterator[None]:
    """Point REDIS_PATTERNS (every feature) at ``url`` for the block; fresh clients."""
    connection.reset_clients()
    try:
        with override_settings(REDIS_PATTERNS=patterns_settings(url, **extra)):
            yield
    finally:
        connection.reset_clients()


@pytest.fixture
def cluster_settings(cluster_url: str) -> Iterator[str]:
    """The whole app on the cluster for this test; yields the URL."""
    with use_connection(cluster_url):
        yield cluster_url


@pytest.fixture
def sentinel_settings(sentinel_url: str) -> Iterator[str]:
    with use_connection(sentinel_url):
        yield sentinel_url


@pytest.fixture
def cluster_factory() -> Iterator[Callable[..., ClusterTopology]]:
    """Start a fresh cluster a test may break; every one is stopped afterwards."""
    _require_topologies()
    started: list[ClusterTopology] = []

    def start(masters: int = 3, replicas: int = 0) -> ClusterTopology:
        cluster = ClusterTopology(masters=masters, replicas=replicas)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def sentinel_factory() -> Iterator[Callable[[], SentinelTopology]]:
    """Start a fresh Sentinel set a test may break; every one is stopped afterwards."""
    _require_topologies()
    started: list[SentinelTopology] = []

    def start() -> SentinelTopology:
        sentinel = SentinelTopology()
        started.append(sentinel)
        return sentinel

    yield start
    for sentinel in started:
        sentinel.stop()
