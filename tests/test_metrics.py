"""Prometheus metrics from the app's signals, read back from prometheus_client's default
registry after real requests, cache calls, locks and revocations against the real test Redis.

Counters are process-wide, so every assertion is on the change a test makes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from django_redispatterns import signals
from django_redispatterns.exceptions import LockLost
from django_redispatterns.locks import Lock, held_key
from django_redispatterns.sessions import logout_everywhere
from tests.test_cache_support import make_cache
from tests.urls_idempotency import idem_settings, post, runs

prometheus_client = pytest.importorskip("prometheus_client")
metrics = pytest.importorskip("django_redispatterns.contrib.metrics")
REGISTRY = prometheus_client.REGISTRY

pytestmark = pytest.mark.usefixtures("redis_client")


@pytest.fixture(autouse=True)
def _connected() -> Iterator[None]:
    metrics.connect()
    yield
    metrics.disconnect()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def label_sets(name: str) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted(sample.labels.items()))
            for family in REGISTRY.collect() for sample in family.samples
            if sample.name == name}


class Delta:
    """The change of some samples across a block: ``delta[name, labels]``."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.samples = samples

    def __enter__(self) -> Delta:
        self.before = [value(n, **labels) for n, labels in self.samples]
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = [value(n, **labels) for n, labels in self.samples]

    def __getitem__(self, index: int) -> float:
        return self.after[index] - self.before[index]


DECISIONS = "redispatterns_ratelimit_decisions_total"


def fixed_rule() -> str:
    """The name the /fixed/ view's rule reports (one request creates its series)."""
    with override_settings(ROOT_URLCONF="tests.urls_ratelimit"):
        Client().get("/fixed/", REMOTE_ADDR="192.0.2.1")
    (rule,) = {dict(s)["rule"] for s in label_sets(DECISIONS)
               if dict(s)["rule"].startswith("tests.urls_ratelimit.fixed ")}
    return str(rule)  # "<group> <rate> <algorithm>": the view's group, never a client


# --- rate limits ----------------------------------------------------------------------


@override_settings(ROOT_URLCONF="tests.urls_ratelimit")
def test_rate_limit_decisions_are_counted_by_rule_and_outcome() -> None:
    rule = fixed_rule()
    with Delta((DECISIONS, {"rule": rule, "outcome": "allowed"}),
               (DECISIONS, {"rule": rule, "outcome": "blocked"})) as delta:
        statuses = [Client().get("/fixed/", REMOTE_ADDR="198.51.100.7").status_code
                    for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    assert (delta[0], delta[1]) == (2, 3)


@override_settings(ROOT_URLCONF="tests.urls_ratelimit")
def test_a_flood_of_distinct_clients_creates_no_new_label_values() -> None:
    fixed_rule()
    before = label_sets(DECISIONS)
    for i in range(300):
        Client().get("/fixed/", REMOTE_ADDR=f"10.{i // 250}.{i % 250}.1")
        Client().get("/fixed/", REMOTE_ADDR="203.0.113.9")  # also some blocked decisions
    after = label_sets(DECISIONS)
    assert after - before <= {s for s in after if dict(s).get("outcome") == "blocked"}
    assert len(after) - len(before) <= 1
    for labels in after:
        for _, text in labels:
            assert "10." not in text and "203.0.113" not in text
    names = {s.name for f in REGISTRY.collect() for s in f.samples
             if s.name.startswith("redispatterns_")}
    assert all("10." not in n for n in names)


@override_settings(ROOT_URLCONF="tests.urls_ratelimit")
def test_fail_open_and_fail_closed_are_counted() -> None:
    name = "redispatterns_ratelimit_unavailable_total"
    from tests import settings as base

    down = {**base.REDIS_PATTERNS, "SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5,
            "RATELIMIT": {"CONNECTION": "redis://127.0.0.1:1/0"}}
    with Delta((name, {"outcome": "fail_open"}), (name, {"outcome": "fail_closed"})) as delta:
        with override_settings(REDIS_PATTERNS=down):
            assert Client().get("/fixed/", REMOTE_ADDR="198.51.100.8").status_code == 200
        closed = {**down, "RATELIMIT": {**down["RATELIMIT"], "FAIL_OPEN": False}}
        with override_settings(REDIS_PATTERNS=closed):
            assert Client().get("/fixed/", REMOTE_ADDR="198.51.100.8").status_code == 503
    assert (delta[0], delta[1]) == (1, 1)
    undecided = {dict(s)["outcome"] for s in label_sets(DECISIONS)}
    assert "undecided" in undecided


# --- idempotency ----------------------------------------------------------------------

IDEM = "redispatterns_idempotency_requests_total"


def test_idempotency_outcomes_are_counted(redis_client: redis.Redis) -> None:
    outcomes = ["stored", "replayed", "mismatch", "key_invalid", "conflict"]
    with idem_settings(), Delta(*[(IDEM, {"outcome": o}) for o in outcomes]) as delta:
        client = Client()
        assert post(client, "/charge/", key="m1").status_code == 201  # stored
        assert post(client, "/charge/", key="m1").status_code == 201  # replayed
        assert post(client, "/charge/", key="m1", data='{"amount": 5}').status_code == 422
        assert post(client, "/charge/", key="bad key\x01").status_code == 400
        # A duplicate while the first is still running: 409.
        slow = threading.Thread(target=lambda: post(Client(), "/charge/?sleep=4&name=slow",
                                                    key="m2"))
        slow.start()
        deadline = time.monotonic() + 30
        while runs(redis_client, "slow:start") < 1:
            assert time.monotonic() < deadline, "the first request never started"
            time.sleep(0.02)
        assert post(client, "/charge/?sleep=4&name=slow", key="m2").status_code == 409
        slow.join(30)
    assert [delta[i] for i in range(5)] == [2, 1, 1, 1, 1]  # stored: m1 and the slow m2


def test_idempotency_missing_key_is_counted() -> None:
    with idem_settings(), Delta((IDEM, {"outcome": "key_missing"})) as delta:
        assert post(Client(), "/decorated/", key=None).status_code == 400
    assert delta[0] == 1


# --- cache ----------------------------------------------------------------------------


def test_stampede_waits_and_stale_values_are_observed(redis_url: str) -> None:
    cache = make_cache(redis_url, STALE_TTL=30, XFETCH_BETA=0)
    wait = "redispatterns_cache_stampede_wait_seconds_count"
    with Delta((wait, {"outcome": "value"}),
               ("redispatterns_cache_stale_served_total", {})) as delta:
        # Each computation says when it started, then takes 3 s: the second caller,
        # asking right after the start, finds it running (however slow the machine).
        started = threading.Event()

        def slow(result: str) -> str:
            started.set()
            time.sleep(3)
            return result

        computing = threading.Thread(target=lambda: cache.get_or_set(
            "metrics-hot", lambda: slow("hot"), 60))
        computing.start()
        assert started.wait(30)
        assert cache.get_or_set("metrics-hot", lambda: "mine", 60) == "hot"  # waited
        computing.join(30)
        cache.get_or_set("metrics-swr", lambda: "old", 0.5)
        time.sleep(0.7)  # expired, still within STALE_TTL
        started.clear()
        recompute = threading.Thread(target=lambda: cache.get_or_set(
            "metrics-swr", lambda: slow("new"), 60))
        recompute.start()
        assert started.wait(30)
        assert cache.get_or_set("metrics-swr", lambda: "x", 60) == "old"  # stale, served
        recompute.join(30)
    assert delta[0] == 1 and delta[1] == 1
    assert value("redispatterns_cache_stampede_wait_seconds_sum", outcome="value") > 0


# --- locks ----------------------------------------------------------------------------


def test_lock_acquires_waits_and_losses_are_counted(redis_client: redis.Redis) -> None:
    wait = "redispatterns_lock_wait_seconds_count"
    with Delta(("redispatterns_lock_acquired_total", {}), (wait, {"outcome": "timed_out"}),
               (wait, {"outcome": "acquired"}), ("redispatterns_lock_lost_total", {})) as delta:
        holder = Lock("metrics-lock", ttl=10, auto_renew=False)
        assert holder.acquire()
        assert not Lock("metrics-lock", ttl=10).acquire(wait=0.3)  # waited, timed out
        # Released 2 s after the next line starts waiting for it.
        releaser = threading.Timer(2.0, holder.release)
        releaser.start()
        waiter = Lock("metrics-lock", ttl=10, auto_renew=False)
        assert waiter.acquire(wait=20)  # waited, then got it
        releaser.join()
        waiter.release()
        # A held lock whose key disappears (eviction, a failover): its renewal sees the loss.
        with pytest.raises(LockLost), Lock("metrics-lost", ttl=0.6) as lost:
            redis_client.delete(held_key("metrics-lost"))
            deadline = time.monotonic() + 10
            while not lost.lost:
                assert time.monotonic() < deadline, "the loss was never noticed"
                time.sleep(0.05)
    assert [delta[i] for i in range(4)] == [3, 1, 1, 1]


# --- sessions -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.urls_sessions")
def test_session_revocations_are_counted() -> None:
    get_user_model().objects.create_user(username="alice", password="pw")
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions"):
        devices = [Client() for _ in range(3)]
        for c in devices:
            assert c.post("/login/", {"username": "alice", "password": "pw"}).status_code == 200
        user = get_user_model().objects.get(username="alice")
        with Delta(("redispatterns_sessions_revoked_total", {}),
                   ("redispatterns_session_revocations_total", {})) as delta:
            assert logout_everywhere(user) == 3
            assert logout_everywhere(user) == 0
    assert (delta[0], delta[1]) == (3, 2)


# --- wiring ---------------------------------------------------------------------------


def test_the_app_config_connects_once_and_disconnect_stops_counting() -> None:
    from django_redispatterns.contrib.metrics.apps import MetricsConfig

    metrics.disconnect()
    config = MetricsConfig("django_redispatterns.contrib.metrics", metrics)
    config.ready()
    config.ready()
    assert len(signals.sessions_revoked.receivers) >= 1
    with Delta(("redispatterns_session_revocations_total", {})) as delta:
        signals.sessions_revoked.send(sender=None, user_id="x", count=0, kept=None)
    assert delta[0] == 1  # one receiver, however often ready() ran
    metrics.disconnect()
    with Delta(("redispatterns_session_revocations_total", {})) as delta:
        signals.sessions_revoked.send(sender=None, user_id="x", count=0, kept=None)
    assert delta[0] == 0


def test_every_metric_is_documented() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    for metric in metrics.METRICS:
        assert f"`{metric._name}" in page, metric._name
