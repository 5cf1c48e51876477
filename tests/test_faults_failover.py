"""Failovers on real topologies: Sentinel (crash and graceful) and Redis Cluster.

Each test drives real traffic through the app while a primary dies (SIGKILL) or is
switched over, and checks the documented outcome (docs/failure-modes.md):

* every call returns within a bounded time — never a hang;
* during the window: rate limits fail open (HTTP 200), sessions answer 503 and keep the
  cookie, locks fail closed (``BackendUnavailable``);
* after the new primary is promoted, requests recover within a bounded time without an
  app restart, sessions written before the fault still load (no silent logout), and held
  locks are still held (no double grant) when the lock write had reached the replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client, override_settings

from django_redispatterns import connection
from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.locks import Lock, held_key
from django_redispatterns.ratelimit import RateLimiter
from tests.redis_servers import KEY_PREFIX
from tests.test_cluster_cache import cache_settings
from tests.topologies import ClusterTopology, SentinelTopology, wait_for
from tests.topology_fixtures import use_connection

PROMOTION_DEADLINE = 30.0  # kill -> new primary promoted (Sentinel/Cluster, 2 cores)
RECOVERY_DEADLINE = 15.0  # promotion -> first successful request
CALL_BOUND = 5.0  # no single request may take longer than this, outage or not

FAULT_MIDDLEWARE = [
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


@pytest.fixture
def http_app() -> Iterator[None]:
    """Our session engine and the fault URLconf for Django's test client."""
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions",
                           MIDDLEWARE=FAULT_MIDDLEWARE, ROOT_URLCONF="tests.urls_faults"):
        yield


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


def session_cookie_deleted(response: Any) -> bool:
    morsel = response.cookies.get("sessionid")
    return morsel is not None and (morsel.value == "" or morsel["max-age"] == 0)


# --- Sentinel -------------------------------------------------------------------------------


def run_through_sentinel_fault(sentinel: SentinelTopology, fault: Callable[[], None],
                               old_port: int, also: Callable[[], None] = lambda: None,
                               ) -> dict[str, Any]:
    """Drive /rl/ and /sess/ (and ``also``) through ``fault``; return what happened."""
    browser = Client(REMOTE_ADDR="198.51.100.7", raise_request_exception=False)
    first = browser.get("/sess/")
    assert first.status_code == 200 and first.json() == {"n": 1}
    assert browser.get("/rl/").status_code == 200
    sentinel.wait_replicated()

    fault()
    faulted = time.monotonic()
    seen: dict[str, Any] = {"rl": [], "sess": [], "promoted": None, "recovered": None,
                            "last_n": 1, "worst": 0.0}
    while time.monotonic() - faulted < PROMOTION_DEADLINE + RECOVERY_DEADLINE:
        rl, rl_time = timed(lambda: browser.get("/rl/"))
        sess, sess_time = timed(lambda: browser.get("/sess/"))
        _, also_time = timed(also)
        seen["worst"] = max(seen["worst"], rl_time, sess_time, also_time)
        seen["rl"].append(rl.status_code)
        seen["sess"].append(sess.status_code)
        assert rl.status_code == 200, "rate limiting must fail open"
        assert sess.status_code in (200, 503), sess.content
        assert not session_cookie_deleted(sess), "the session cookie was deleted (F18)"
        if sess.status_code == 200:
            n = sess.json()["n"]
            assert n == seen["last_n"] + 1, f"session data lost or duplicated: {n}"
            seen["last_n"] = n
        if seen["promoted"] is None:
            try:
                if sentinel.primary_port() != old_port:
                    seen["promoted"] = time.monotonic()
            except Exception:  # a sentinel busy electing
                pass
        if seen["promoted"] is not None and sess.status_code == 200:
            seen["recovered"] = time.monotonic()
            break
        time.sleep(0.05)
    seen["faulted"] = faulted
    return seen


def test_sentinel_crash_failover_rate_limits_and_sessions_recover(
    sentinel_factory: Callable[[], SentinelTopology], http_app: None
) -> None:
    sentinel = sentinel_factory()
    with use_connection(sentinel.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5):
        old = sentinel.primary()
        seen = run_through_sentinel_fault(sentinel, old.kill, old.port)
    assert seen["worst"] < CALL_BOUND, f"a request took {seen['worst']:.1f}s"
    assert seen["promoted"] is not None, "Sentinel did not promote the replica in time"
    assert seen["promoted"] - seen["faulted"] < PROMOTION_DEADLINE
    assert seen["recovered"] is not None, f"no recovery after promotion: {seen['sess'][-5:]}"
    assert seen["recovered"] - seen["promoted"] < RECOVERY_DEADLINE
    assert 503 in seen["sess"], "the outage was not observed (test would prove nothing)"


def test_sentinel_graceful_failover_loses_nothing_and_counts_stay_exact(
    sentinel_factory: Callable[[], SentinelTopology], http_app: None
) -> None:
    """FO-05: ``SENTINEL FAILOVER`` under traffic. Sessions keep every visit, and rate-limit
    counts stay exact (invariant I3): successes <= counted <= successes + errors, i.e. no
    hit duplicated by a re-sent script and none lost once acknowledged."""
    sentinel = sentinel_factory()
    with use_connection(sentinel.url, SOCKET_TIMEOUT=1.0, SOCKET_CONNECT_TIMEOUT=1.0):
        limiter = RateLimiter("100000/m", algorithm="fixed_window")
        tally = {"ok": 0, "errors": 0}

        def hit() -> None:
            try:
                limiter.hit("exact")
                tally["ok"] += 1
            except BackendUnavailable:
                tally["errors"] += 1

        def switch() -> None:
            sentinel.sentinel_client().execute_command("SENTINEL", "FAILOVER", sentinel.service)

        seen = run_through_sentinel_fault(sentinel, switch, sentinel.primary_port(), also=hit)
        for _ in range(20):  # a little traffic on the new primary
            hit()
        state = limiter.peek("exact")
        used = state.limit - state.remaining
        assert tally["ok"] <= used <= tally["ok"] + tally["errors"], (tally, used)
        fresh = RateLimiter("5/m", algorithm="sliding_window")
        assert [fresh.hit("after").allowed for _ in range(6)] == [True] * 5 + [False]
    assert seen["worst"] < CALL_BOUND
    assert seen["recovered"] is not None
    assert seen["recovered"] - seen["faulted"] < PROMOTION_DEADLINE


# --- Cluster --------------------------------------------------------------------------------


def test_cluster_failover_while_locks_are_held(
    cluster_factory: Callable[..., ClusterTopology],
) -> None:
    cluster = cluster_factory(masters=3, replicas=1)
    with use_connection(cluster.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5):
        holder = Lock("payroll", ttl=60, auto_renew=False)
        assert holder.acquire()
        first_fence = holder.fencing_token
        victim = cluster.master_for_key(held_key("payroll"))
        cluster.wait_replicated(victim)  # the lock write reached the replica
        replica = cluster.replica_of(victim)

        victim.kill()
        killed = time.monotonic()
        outcomes: list[str] = []
        worst = 0.0
        recovered_at = None
        while time.monotonic() - killed < PROMOTION_DEADLINE + RECOVERY_DEADLINE:
            started = time.monotonic()
            try:
                got = Lock("payroll", ttl=5).acquire()
                outcomes.append("granted" if got else "held")
            except BackendUnavailable:
                outcomes.append("unavailable")
            worst = max(worst, time.monotonic() - started)
            assert outcomes[-1] != "granted", "a held lock was granted twice"
            if outcomes[-1] == "held":
                recovered_at = time.monotonic()
                break
            time.sleep(0.1)
        assert worst < CALL_BOUND, f"an acquire took {worst:.1f}s"
        assert recovered_at is not None, f"no recovery: {outcomes[-5:]}"
        assert "unavailable" in outcomes  # fail closed while the slot had no master
        assert replica.is_master()
        # the original holder still owns it on the promoted replica, and can release it
        assert holder.owned()
        holder.release()
        with Lock("payroll", ttl=5) as again:
            assert again.fencing_token > first_fence  # type: ignore[operator]
        # locks on the surviving masters were never affected
        other = next(n for n in ("a", "b", "c", "d", "e", "f", "g", "h")
                     if cluster.master_for_key(held_key(n, namespace=n)).port != victim.port)
        with Lock(other, namespace=other, ttl=5):
            pass


def test_cluster_failover_under_session_and_rate_limit_traffic(
    cluster_factory: Callable[..., ClusterTopology], http_app: None
) -> None:
    """FO-03 with HTTP traffic: while a master is down and the cluster reports
    ``CLUSTERDOWN`` (every slot, every master), sessions answer 503 with the cookie kept
    and never come back empty; rate limits fail open; all recover after the promotion."""
    cluster = cluster_factory(masters=3, replicas=1)
    with use_connection(cluster.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5):
        browser = Client(REMOTE_ADDR="198.51.100.8", raise_request_exception=False)
        assert browser.get("/sess/").json() == {"n": 1}
        victim = cluster.master_for_key(  # the master holding this session
            next(k for k in cluster.scan_keys(f"{KEY_PREFIX}:sess:*") if b":s:" in k))
        for master in cluster.masters():
            cluster.wait_replicated(master)
        victim.kill()
        killed = time.monotonic()
        last_n, statuses, worst, recovered = 1, [], 0.0, None
        while time.monotonic() - killed < PROMOTION_DEADLINE + RECOVERY_DEADLINE:
            rl, rl_time = timed(lambda: browser.get("/rl/"))
            sess, sess_time = timed(lambda: browser.get("/sess/"))
            worst = max(worst, rl_time, sess_time)
            statuses.append(sess.status_code)
            assert rl.status_code == 200, "rate limiting must fail open"
            assert sess.status_code in (200, 503), sess.content
            assert not session_cookie_deleted(sess), "the session cookie was deleted (F18)"
            if sess.status_code == 200:
                n = sess.json()["n"]
                assert n == last_n + 1, f"session came back empty or stale: n={n}"
                last_n = n
                if 503 in statuses:
                    recovered = time.monotonic()
                    break
            time.sleep(0.05)
        assert worst < CALL_BOUND, f"a request took {worst:.1f}s"
        assert 503 in statuses, "the outage was not observed (test would prove nothing)"
        assert recovered is not None, f"no recovery: {statuses[-5:]}"


def test_cluster_down_keeps_sessions_on_healthy_masters_signed_in(
    cluster_factory: Callable[..., ClusterTopology], http_app: None
) -> None:
    """A master dies with no replica: once the others mark it failed, the whole cluster
    answers ``CLUSTERDOWN`` — also for sessions on healthy masters. That must be a 503 with
    the cookie kept, never an empty session (a silent logout, F18)."""
    cluster = cluster_factory(masters=3)
    with use_connection(cluster.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5):
        browser = Client(REMOTE_ADDR="198.51.100.9", raise_request_exception=False)
        assert browser.get("/sess/").json() == {"n": 1}
        session_key = browser.cookies["sessionid"].value
        home = cluster.master_for_key(
            next(k for k in cluster.scan_keys(f"{KEY_PREFIX}:sess:*") if b":s:" in k))
        victim = next(m for m in cluster.masters() if m.port != home.port)
        victim.kill()
        wait_for(lambda: home.cluster_info()["cluster_state"] == "fail", PROMOTION_DEADLINE,
                 "the cluster to notice the lost master")
        for _ in range(3):
            response, took = timed(lambda: browser.get("/sess/"))
            assert took < CALL_BOUND
            assert response.status_code == 503, response.content
            assert not session_cookie_deleted(response)
        # the cache degrades to computing (IGNORE_EXCEPTIONS) instead of raising CLUSTERDOWN
        caches_on_cluster = cache_settings(cluster.url, IGNORE_EXCEPTIONS=True)
        with override_settings(CACHES=caches_on_cluster):
            value, took = timed(lambda: caches["patterns"].get_or_set(
                "report", lambda: "computed", 60))
        assert value == "computed" and took < CALL_BOUND
        victim.start()
        cluster.wait_healthy()
        assert browser.cookies["sessionid"].value == session_key
        wait_for(lambda: browser.get("/sess/").status_code == 200, RECOVERY_DEADLINE,
                 "sessions to recover")
        assert browser.get("/sess/").json()["n"] >= 3  # the session survived, not recreated


def test_cluster_master_without_replica_fails_fast_and_recovers_on_restart(
    cluster_factory: Callable[..., ClusterTopology],
) -> None:
    """FO-04: a master dies and nothing can take over: every call fails within the bound
    (no hang), and the app recovers by itself when the node comes back."""
    cluster = cluster_factory(masters=3)
    with use_connection(cluster.url, SOCKET_TIMEOUT=0.5, SOCKET_CONNECT_TIMEOUT=0.5):
        limiter = RateLimiter("1000/m", algorithm="sliding_window")
        identity = "victim-id"
        limiter.hit(identity)
        victim = cluster.master_for_key(limiter.key(identity))
        victim.kill()
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                limiter.hit(identity)
            assert time.monotonic() - started < CALL_BOUND
        victim.start()  # same node id and slots (nodes.conf kept), empty dataset
        cluster.wait_healthy()
        wait_for(lambda: _hit_ok(limiter, identity), RECOVERY_DEADLINE, "recovery after restart")
    connection.reset_clients()


def _hit_ok(limiter: RateLimiter, identity: str) -> bool:
    try:
        return bool(limiter.hit(identity).allowed)
    except BackendUnavailable:
        return False
