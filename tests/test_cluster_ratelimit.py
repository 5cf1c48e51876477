"""Rate limiting on a real 3-master Redis Cluster, every algorithm.

Each limiter's key (counter, sliding-window set or GCRA state) carries the hash tag
of the identity's keyed digest, so every decision is one single-slot EVALSHA; several rules
go out as one cluster pipeline that redis-py splits per node.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.test import Client

from django_redispatterns import connection
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.ratelimit.limiter import hit_many
from tests.redis_servers import KEY_PREFIX
from tests.topologies import ClusterTopology

ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket"]
ODD_IDENTITIES = ["", "}", "{x}", "192.0.2.1", "ünïcode", "x" * 2000]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exactly_limit_hits_pass_for_odd_identities(cluster_settings: str, algorithm: str) -> None:
    limiter = RateLimiter("3/m", algorithm=algorithm)
    for identity in ODD_IDENTITIES:
        allowed = [limiter.hit(identity).allowed for _ in range(5)]
        assert allowed == [True, True, True, False, False], identity
    blocked = limiter.peek("}")
    assert not blocked.allowed or blocked.remaining == 0
    assert limiter.reset("}")
    assert limiter.hit("}").allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_keys_spread_over_masters_and_hold_no_identity(
    redis_cluster: ClusterTopology, cluster_settings: str, algorithm: str
) -> None:
    limiter = RateLimiter("5/m", algorithm=algorithm)
    for i in range(30):
        limiter.hit(f"198.51.100.{i}")
    nodes_with_keys = {n.port for n in redis_cluster.masters()
                       if any(True for _ in n.client().scan_iter(match=f"{KEY_PREFIX}:rl:*"))}
    assert len(nodes_with_keys) == len(redis_cluster.masters())
    names = [k.decode() for k in redis_cluster.scan_keys(f"{KEY_PREFIX}:rl:*")]
    assert names and not any("198.51.100" in k for k in names)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exact_under_threads_on_cluster(cluster_settings: str, algorithm: str) -> None:
    limiter = RateLimiter("25/m", algorithm=algorithm)
    allowed: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(10):
            ok = limiter.hit("shared").allowed
            with lock:
                allowed.append(ok)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(allowed) == 60 and sum(allowed) == 25


def test_several_rules_in_one_cluster_pipeline(cluster_settings: str) -> None:
    limiters = [RateLimiter("2/m", algorithm=a, group=f"g{i}")
                for i, a in enumerate(ALGORITHMS * 3)]
    hits = [(lim, f"id-{i}", 1, None) for i, lim in enumerate(limiters)]
    for _ in range(2):
        assert all(d.allowed for d in hit_many(hits))
    assert not any(d.allowed for d in hit_many(hits))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_async_hits_on_cluster(cluster_settings: str, algorithm: str) -> None:
    limiter = RateLimiter("4/m", algorithm=algorithm)

    async def main() -> list[bool]:
        try:
            return [(await limiter.ahit("async-id")).allowed for _ in range(6)]
        finally:
            await connection.get_async_client("RATELIMIT", resend=False).aclose()

    assert asyncio.run(main()) == [True] * 4 + [False] * 2


def test_resent_hit_counts_once_on_cluster(cluster_settings: str) -> None:
    limiter = RateLimiter("2/m", algorithm="sliding_window")
    assert limiter.hit("resend", request_id="r1").allowed
    assert limiter.hit("resend", request_id="r1").allowed  # re-sent call, counted once
    assert limiter.hit("resend").allowed
    assert not limiter.hit("resend").allowed


@pytest.mark.urls("tests.urls_ratelimit")
def test_decorated_view_answers_429_on_cluster(cluster_settings: str) -> None:
    client = Client(REMOTE_ADDR="203.0.113.9")
    codes = [client.post("/login/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
