"""Capacity notes of docs/scale.md, measured: keys and bytes per record (benchmarks/capacity.py).

Bounds are loose (allocator and Redis versions differ); key counts are exact, on one node
and on a Cluster alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from benchmarks import capacity
from tests.topologies import ClusterTopology

EXPECTED_KEYS = {
    "session, anonymous (small cart)": 1,
    "session, signed in + index entry": 2,
    "5 sessions of one user": 6,
    "rate limit fixed_window, 1 hit": 1,
    "rate limit fixed_window, 100 hits in window": 1,
    "rate limit sliding_window, 1 hit": 1,
    "rate limit sliding_window, 100 hits in window": 1,
    "rate limit token_bucket, 1 hit": 1,
    "rate limit token_bucket, 100 hits in window": 1,
    "idempotency record (201, 96 B JSON body)": 1,
    "lock, held (+ fencing counter)": 2,
}
MAX_BYTES = {  # generous ceilings: a regression that doubles a record fails
    "session, signed in + index entry": 2500,
    "rate limit sliding_window, 1 hit": 400,
    "rate limit fixed_window, 1 hit": 300,
    "rate limit token_bucket, 1 hit": 300,
    # one key whatever the request rate (no per-hit re-send markers, no silent duplicate writes)
    "rate limit fixed_window, 100 hits in window": 300,
    "rate limit token_bucket, 100 hits in window": 300,
    "idempotency record (201, 96 B JSON body)": 1000,
    "lock, held (+ fencing counter)": 800,
}


@pytest.fixture
def sessions_engine() -> Iterator[None]:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        yield


def check(rows: list[capacity.Footprint]) -> None:
    got = {r.record: r for r in rows}
    assert {name: r.keys for name, r in got.items()} == EXPECTED_KEYS
    for name, ceiling in MAX_BYTES.items():
        assert 0 < got[name].bytes < ceiling, (name, got[name].bytes)


@pytest.mark.django_db
def test_footprint_per_record_on_one_node(own_redis: redis.Redis,
                                          sessions_engine: None) -> None:
    rows = capacity.measure_all(own_redis)
    check(rows)
    assert "| lock, held (+ fencing counter) | 2 |" in capacity.table(rows)


@pytest.mark.django_db
def test_footprint_per_record_on_cluster(redis_cluster: ClusterTopology, cluster_settings: str,
                                         sessions_engine: None) -> None:
    client: Any = redis_cluster.client()
    check(capacity.measure_all(client))
