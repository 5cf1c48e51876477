"""Cluster: the same operations on a private 3-master Redis Cluster and on one node.

Scenarios (interleaved rounds, same process, loopback):
1. lock acquire+release: ours on Cluster, redis-py's ``RedisCluster.lock`` on Cluster, and
   ours on a single node — what Cluster costs us, and how we compare there;
2. one rate-limit decision (sliding window): ours on Cluster vs ours on one node;
3. three rules for one request in one pipeline (``hit_many``), split per node on Cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.test import override_settings

from benchmarks.harness import compare
from django_redispatterns import connection
from django_redispatterns.locks import Lock
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.ratelimit.limiter import hit_many
from tests.topologies import ClusterTopology


def _lock_cycle(name: str, conn: str) -> Callable[[], None]:
    def cycle() -> None:
        lock = Lock(name, ttl=10, auto_renew=False, connection=conn)
        lock.acquire()
        lock.release()
    return cycle


def _redis_py_cycle(client: Any, name: str) -> Callable[[], None]:
    def cycle() -> None:
        lock = client.lock(name, timeout=10)
        lock.acquire(blocking=False)
        lock.release()
    return cycle


def run() -> None:
    cluster = ClusterTopology(masters=3)
    single = settings.REDIS_URL
    try:
        connection.reset_clients()
        with override_settings(REDIS_PATTERNS={**settings.REDIS_PATTERNS,
                                               "CONNECTION": cluster.url}):
            raw_cluster = connection.client_for(cluster.url)
            compare(
                "cluster: lock acquire+release (one thread, auto_renew=False)",
                {
                    "django-redispatterns Lock on Cluster": _lock_cycle("bench-c1", cluster.url),
                    "redis-py RedisCluster.lock on Cluster": _redis_py_cycle(raw_cluster,
                                                                             "bench-c2"),
                    "django-redispatterns Lock on one node": _lock_cycle("bench-c3", single),
                },
                ops=500, rounds=5,
            )
            on_cluster = RateLimiter("1000000/m", algorithm="sliding_window")
            on_single = RateLimiter("1000000/m", algorithm="sliding_window", connection=single)
            compare(
                "cluster: one rate-limit decision (sliding window)",
                {
                    "django-redispatterns on Cluster": lambda: on_cluster.hit("bench-ip"),
                    "django-redispatterns on one node": lambda: on_single.hit("bench-ip"),
                },
                ops=1000, rounds=5,
            )
            rules_cluster = [RateLimiter("1000000/m", algorithm=a, group=f"g{i}")
                             for i, a in enumerate(("fixed_window", "sliding_window",
                                                    "token_bucket"))]
            rules_single = [RateLimiter("1000000/m", algorithm=a, group=f"g{i}",
                                        connection=single)
                            for i, a in enumerate(("fixed_window", "sliding_window",
                                                   "token_bucket"))]
            compare(
                "cluster: three rules for one request (one pipeline)",
                {
                    "django-redispatterns on Cluster": lambda: hit_many(
                        [(r, f"id-{i}", 1, None) for i, r in enumerate(rules_cluster)]),
                    "django-redispatterns on one node": lambda: hit_many(
                        [(r, f"id-{i}", 1, None) for i, r in enumerate(rules_single)]),
                },
                ops=500, rounds=5,
            )
    finally:
        connection.reset_clients()
        cluster.stop()
