"""``redis_audit`` and the deploy checks against real Cluster and Sentinel topologies."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redispatterns import checks
from tests.redis_servers import KEY_PREFIX
from tests.topologies import ClusterTopology, SentinelTopology
from tests.topology_fixtures import patterns_settings


@pytest.mark.allow_no_ttl
def test_audit_scans_every_master_of_the_cluster(
    redis_cluster: ClusterTopology, cluster_settings: str
) -> None:
    client = redis_cluster.client()
    for i in range(60):  # spread over all three masters
        client.set(f"{KEY_PREFIX}:audit:ttl:{i}", "x" * 10, ex=600)
    for i in range(9):
        client.set(f"{KEY_PREFIX}:audit:forever:{i}", "y" * (100 * (i + 1)))
    owners = {redis_cluster.master_for_key(f"{KEY_PREFIX}:audit:forever:{i}").port
              for i in range(9)}
    assert len(owners) > 1

    out = io.StringIO()
    call_command("redis_audit", "--json", "--prefix", f"{KEY_PREFIX}:audit", stdout=out)
    report = json.loads(out.getvalue())
    assert len(report["servers"]) == 3
    assert report["scanned"] == 69
    assert report["no_ttl"]["count"] == 9
    assert report["largest"][0]["key"] == f"{KEY_PREFIX}:audit:forever:8"
    assert {s["endpoint"] for s in report["servers"]} == {
        f"127.0.0.1:{n.port}" for n in redis_cluster.masters()}

    with pytest.raises(CommandError) as info:
        call_command("redis_audit", "--prefix", f"{KEY_PREFIX}:audit", "--fail-on-no-ttl",
                     stdout=io.StringIO())
    assert info.value.returncode == 1
    redis_cluster.flush()


@pytest.mark.allow_no_ttl
def test_audit_through_sentinel_reads_the_primary(
    redis_sentinel: SentinelTopology, sentinel_settings: str
) -> None:
    primary = redis_sentinel.primary().client()
    primary.set(f"{KEY_PREFIX}:audit:forever", "x")
    primary.set(f"{KEY_PREFIX}:audit:ttl", "x", ex=600)
    out = io.StringIO()
    call_command("redis_audit", "--json", "--prefix", f"{KEY_PREFIX}:audit", stdout=out)
    report = json.loads(out.getvalue())
    assert report["scanned"] == 2 and report["no_ttl"]["count"] == 1
    assert report["servers"][0]["role"] == "master"
    primary.delete(f"{KEY_PREFIX}:audit:forever")


def test_deploy_checks_visit_every_cluster_master(redis_cluster: ClusterTopology) -> None:
    # a LOCKS section marks the feature as used, so its connection is probed
    with override_settings(REDIS_PATTERNS=patterns_settings(redis_cluster.url, LOCKS={})):
        messages = checks.check_redis_servers()
    ids = {m.id for m in messages}
    assert not any(m.level >= 40 for m in messages), messages  # no errors
    # each master answered (no "could not reach"), and each is judged on its own
    assert "redispatterns.W010" not in ids
    # (the role list also names every other feature imported by this test run)
    no_limit = {m.msg.split(" (")[0] for m in messages
                if m.id == "redispatterns.W011" and "locks" in m.msg}
    assert no_limit == {f"Redis at 127.0.0.1:{n.port}" for n in redis_cluster.masters()}


def test_cluster_url_with_a_database_is_an_error(redis_cluster: ClusterTopology) -> None:
    with override_settings(REDIS_PATTERNS=patterns_settings(redis_cluster.url + "/2")):
        messages = checks.check_settings() + checks.check_redis_servers()
    assert "redispatterns.E010" in {m.id for m in messages}
