"""Operator commands on a 3-master Cluster: SCAN reaches every master, per-key calls route."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client

from django_redispatterns.locks import Lock
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.ratelimit.identity import identity_for
from tests.topologies import ClusterTopology
from tests.topology_fixtures import use_connection
from tests.urls_idempotency import idem_settings, post


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_locks_list_and_release_on_cluster(redis_cluster: ClusterTopology,
                                           cluster_settings: str) -> None:
    namespaces = [f"ns{i}" for i in range(6)]  # several slots, several masters
    held = [Lock("job", namespace=ns, ttl=30, auto_renew=False) for ns in namespaces]
    for lock in held:
        assert lock.acquire()
    owners = {redis_cluster.master_for_key("{" + ns + "}").port for ns in namespaces}
    assert len(owners) > 1
    listing = run("locks", "list")
    assert listing.count("\njob\t") + listing.startswith("job\t") == len(namespaces)
    assert "released" in run("locks", "release", "job", "--namespace", "ns3", "--force")
    assert not held[3].owned() and held[2].owned()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "token_bucket"])
def test_ratelimit_inspect_and_reset_on_cluster(cluster_settings: str, algorithm: str) -> None:
    limiter = RateLimiter("2/m", algorithm=algorithm, group="ops")
    identity = identity_for("ip", "203.0.113.5")  # what the middleware derives
    for _ in range(3):
        limiter.hit(identity)
    args = ["ratelimit", "--identity", "203.0.113.5", "--rate", "2/m", "--group", "ops",
            "--algorithm", algorithm]
    assert "BLOCKED" in run(*args[:1], "inspect", *args[1:])
    assert "cleared" in run(*args[:1], "reset", *args[1:])
    assert limiter.hit(identity).allowed


def test_idempotency_count_and_show_on_cluster(cluster_url: str) -> None:
    with use_connection(cluster_url), idem_settings(CONNECTION=cluster_url):
        client = Client()
        for i in range(6):
            assert post(client, "/charge/", key=f"op-{i}").status_code == 201
        assert run("idempotency", "count").strip() == "6"
        shown = run("idempotency", "show", "--scope", "alice", "op-3")
        assert "201" in shown, shown
        assert "deleted" in run("idempotency", "delete", "--scope", "alice", "op-3")
        assert run("idempotency", "count").strip() == "5"


@pytest.mark.django_db
def test_sessions_list_and_revoke_on_cluster(cluster_settings: str) -> None:
    from django.contrib.auth import SESSION_KEY, get_user_model
    from django.test import override_settings

    from django_redispatterns.sessions import SessionStore, session_handle, user_sessions

    user = get_user_model().objects.create_user("ops-user", password="x")
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        keys = []
        for _ in range(3):
            store = SessionStore()
            store[SESSION_KEY] = str(user.pk)
            store.save()
            keys.append(store.session_key)
        assert len(run("sessions", "list", "ops-user").strip().splitlines()) >= 3
        run("sessions", "revoke", "ops-user", "--keep", keys[0])
        assert [s.handle for s in user_sessions(user)] == [session_handle(keys[0])]
