"""FO-10 and I11 on Cluster: every feature survives losing the script cache on every node,
and the only scripts Redis ever caches are the files in ``lua/`` (no script built from
request data)."""

from __future__ import annotations

import pytest
from django.contrib.auth import SESSION_KEY
from django.core.cache import caches
from django.test import Client, override_settings

from django_redispatterns import scripts
from django_redispatterns.locks import Lock, MultiLock
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.sessions import SessionStore, logout_everywhere
from tests.test_cluster_cache import cache_settings
from tests.topologies import ClusterTopology
from tests.topology_fixtures import patterns_settings
from tests.urls_idempotency import idem_settings, post


def every_feature_once(cluster_url: str) -> None:
    """One pass over each feature's scripts, with odd identities and names."""
    with Lock("fo10", ttl=5, auto_renew=False) as lock:
        lock.extend(10)
    with MultiLock(["a}", "{b"], ttl=5):
        pass
    for algorithm in ("fixed_window", "sliding_window", "token_bucket"):
        limiter = RateLimiter("3/m", algorithm=algorithm)
        assert limiter.hit("}").allowed and limiter.hit("").allowed
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        store = SessionStore()
        store["x"] = 1
        store.save()
        store[SESSION_KEY] = "77"
        store.save()
        store.cycle_key()
        assert logout_everywhere(77) == 1
    with idem_settings(CONNECTION=cluster_url):
        client = Client()
        assert post(client, "/charge/", key="fo10").status_code == 201
        assert post(client, "/charge/", key="fo10")["Idempotent-Replayed"] == "true"
    with override_settings(CACHES=cache_settings(cluster_url),
                           REDIS_PATTERNS=patterns_settings(cluster_url)):
        cache = caches["patterns"]
        assert cache.get_or_set("fo10:{t}", lambda: 1, 60) == 1
        assert cache.incr("fo10:{t}") == 2


@pytest.mark.django_db
def test_every_feature_works_right_after_the_script_cache_is_lost(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    every_feature_once(cluster_settings)  # warm: scripts cached where their keys live
    redis_cluster.script_flush()  # a restart or failover empties every node's cache
    redis_cluster.flush()
    every_feature_once(cluster_settings)  # first calls answer NOSCRIPT, then EVAL: fine


@pytest.mark.django_db
def test_only_shipped_scripts_are_ever_cached(redis_cluster: ClusterTopology,
                                              cluster_settings: str) -> None:
    redis_cluster.script_flush()
    every_feature_once(cluster_settings)
    shipped = [scripts.script(name).sha for name in scripts.script_names()]
    used = set()
    for node in redis_cluster.masters():
        client = node.client()
        cached = int(client.info("memory")["number_of_cached_scripts"])
        ours = [sha for sha, hit in zip(shipped, client.script_exists(*shipped), strict=True)
                if hit]
        assert cached == len(ours), f"{node.port} caches scripts we do not ship"
        used.update(ours)
    assert len(used) >= 10  # the pass above really exercised the features' scripts
