"""Idempotency on Redis Cluster and behind Sentinel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import AsyncClient, Client

from django_redispatterns import connection
from tests.redis_servers import KEY_PREFIX
from tests.topologies import ClusterTopology, SentinelTopology
from tests.urls_idempotency import idem_settings, post


def _scenario(url: str) -> list[Any]:
    connection.reset_clients()
    with idem_settings(CONNECTION=url):
        client = Client()
        first = post(client, "/charge/", key="topo-1")
        again = post(client, "/charge/", key="topo-1")
        other = post(client, "/charge/", key="topo-1", data="{}")
        streaming = post(client, "/stream/", key="topo-2")  # held until closed
        busy = post(client, "/stream/", key="topo-2")

        async def asend() -> list[Any]:
            aclient = AsyncClient()
            headers = {"Idempotency-Key": "topo-3", "X-Test-User": "alice"}
            return [await aclient.post("/acharge/", "{}", content_type="application/json",
                                       headers=headers) for _ in range(2)]

        afirst, aagain = asyncio.run(asend())
        streaming.close()  # frees the claim (and sends request_finished: needs the db)
    connection.reset_clients()
    return [first, again, other, busy, afirst, aagain]


def _check(responses: list[Any]) -> None:
    first, again, other, busy, afirst, aagain = responses
    assert first.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422 and busy.status_code == 409
    assert afirst.status_code == 201 and aagain["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
def test_on_redis_cluster(redis_cluster: ClusterTopology, cluster_url: str) -> None:
    _check(_scenario(cluster_url))
    keys = redis_cluster.scan_keys(f"{KEY_PREFIX}:idem:*")
    assert len(keys) == 2  # the streaming one was freed when closed
    assert all(redis_cluster.master_for_key(k).client().pttl(k) > 0 for k in keys)


@pytest.mark.django_db
def test_behind_sentinel_and_across_a_graceful_failover(
    redis_sentinel: SentinelTopology, sentinel_url: str
) -> None:
    _check(_scenario(sentinel_url))
    redis_sentinel.wait_replicated()
    redis_sentinel.failover()
    connection.reset_clients()
    with idem_settings(CONNECTION=sentinel_url):
        replay = post(Client(), "/charge/", key="topo-1")
    connection.reset_clients()
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"


@pytest.fixture(autouse=True)
def _fresh_clients() -> Any:
    yield
    connection.reset_clients()
