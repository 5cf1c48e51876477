"""One Redis, every feature, three faults: the documented outcome, never a hang.

Each test points the whole app (rate limits, sessions, idempotency, the cache, locks) at a
throwaway ``redis-server`` with a 0.5 s socket timeout, serves one request per feature
before, during and after a fault, and checks the Redis-unusable policy (docs/failure-modes.md):

==============  =========================  ========================================
feature         while Redis is unusable    afterwards
==============  =========================  ========================================
rate limits     fail open (200), logged    counting again
sessions        503, cookie kept           same session (pause/stop) or a fresh one
                                           (restart without persistence)
idempotency     503 + Retry-After, view    replay / exactly one run (pause/stop);
                not run                    a fresh record after a restart
cache           value computed (degrade)   cached again
locks           fail closed (503)          acquirable again
==============  =========================  ========================================

Faults: SIGKILL + restart (no persistence), ``CLIENT PAUSE`` longer than the socket
timeout, and SIGSTOP (a hung server with open sockets).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from django_redispatterns import connection
from tests import urls_faults
from tests.redis_servers import CACHE_PREFIX, RedisServer
from tests.topologies import wait_for

pytestmark = pytest.mark.topology

SOCKET_TIMEOUT = 0.5
REQUEST_BOUND = 5.0  # generous for 2 shared cores; the policy answer takes ~1 s at most
FAULT_SECONDS = 2.0  # pause/stop length: four socket timeouts

MIDDLEWARE = [
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


def app_settings(server: RedisServer) -> override_settings:
    from tests import settings as base

    return override_settings(
        ROOT_URLCONF="tests.urls_faults",
        MIDDLEWARE=MIDDLEWARE,
        SESSION_ENGINE="django_redispatterns.sessions",
        CACHES={
            **base.CACHES,
            "patterns": {
                "BACKEND": "django_redispatterns.cache.RedisCache",
                "LOCATION": server.url,
                "KEY_PREFIX": CACHE_PREFIX,
                "TIMEOUT": 300,
                "OPTIONS": {"SOCKET_TIMEOUT": SOCKET_TIMEOUT,
                            "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT,
                            "IGNORE_EXCEPTIONS": True, "STAMPEDE_LEASE": 2},
            },
        },
        REDIS_PATTERNS={
            **base.REDIS_PATTERNS,
            "CONNECTION": server.url,
            "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
            "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT,
            "IDEMPOTENCY": {"LEASE": 2},
        },
    )


@pytest.fixture
def app(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    server = redis_server_factory()
    urls_faults.RUNS.clear()
    connection.reset_clients()
    with app_settings(server):
        yield server
    connection.reset_clients()


class Browser:
    """One user: a test client with a session cookie, timing every request."""

    def __init__(self) -> None:
        self.client = Client(REMOTE_ADDR="192.0.2.44", raise_request_exception=False)
        self.worst = 0.0

    def request(self, method: str, path: str, **headers: str) -> Any:
        started = time.monotonic()
        response = getattr(self.client, method)(path, headers=headers)
        took = time.monotonic() - started
        self.worst = max(self.worst, took)
        assert took < REQUEST_BOUND, f"{method.upper()} {path} took {took:.1f}s"
        return response

    def everything(self) -> dict[str, Any]:
        """One request per feature."""
        return {
            "rl": self.request("get", "/rl/"),
            "sess": self.request("get", "/sess/"),
            "charge": self.request("post", "/charge/", **{"Idempotency-Key": "order-1"}),
            "cache": self.request("get", "/cache/"),
            "job": self.request("post", "/job/"),
        }


def cookie_deleted(response: Any) -> bool:
    morsel = response.cookies.get("sessionid")
    return morsel is not None and (morsel.value == "" or morsel["max-age"] == 0)


def assert_healthy_before(browser: Browser) -> dict[str, Any]:
    before = browser.everything()
    assert {k: r.status_code for k, r in before.items()} == {
        "rl": 200, "sess": 200, "charge": 201, "cache": 200, "job": 200}
    assert before["sess"].json() == {"n": 1}
    assert urls_faults.RUNS == {"charge": 1, "compute": 1, "job": 1}
    return before


def assert_policies_during_outage(during: dict[str, Any]) -> None:
    assert during["rl"].status_code == 200  # fail open
    assert during["sess"].status_code == 503  # not an empty session, not a logout
    assert not cookie_deleted(during["sess"]) and "sessionid" not in during["sess"].cookies
    assert during["charge"].status_code == 503  # fail closed
    assert int(during["charge"]["Retry-After"]) >= 1
    assert during["cache"].status_code == 200  # degrade: computed without Redis
    assert during["job"].status_code == 503  # locks fail closed


def test_kill_and_restart_without_persistence(app: RedisServer) -> None:
    browser = Browser()
    before = assert_healthy_before(browser)

    app.kill()
    during = browser.everything()
    assert_policies_during_outage(during)
    assert during["cache"].json() == {"report": 2}  # computed, not served
    assert urls_faults.RUNS["charge"] == 1  # the idempotent view did not run
    assert urls_faults.RUNS["job"] == 1  # nor did the locked job

    app.start()  # an empty dataset: what a restart without persistence means
    after = browser.everything()
    assert after["rl"].status_code == 200 and after["job"].status_code == 200
    # the session is gone with the data: a fresh session, and the old cookie replaced
    assert after["sess"].status_code == 200 and after["sess"].json() == {"n": 1}
    assert after["sess"].cookies["sessionid"].value != before["sess"].cookies[
        "sessionid"].value
    # the idempotency record is gone too: the same key runs the view again (documented)
    assert after["charge"].status_code == 201 and urls_faults.RUNS["charge"] == 2
    assert after["cache"].json() == {"report": 3}  # recomputed once, then cached
    assert browser.request("get", "/cache/").json() == {"report": 3}


@pytest.mark.parametrize("fault", ["client_pause", "client_pause_write", "sigstop"])
def test_server_unresponsive_longer_than_the_socket_timeout(app: RedisServer, fault: str) -> None:
    browser = Browser()
    before = assert_healthy_before(browser)
    session_cookie = before["sess"].cookies["sessionid"].value

    admin = app.client()
    if fault.startswith("client_pause"):
        # WRITE mode (what a failover does) still serves reads but blocks every script
        mode = "WRITE" if fault.endswith("write") else "ALL"
        admin.execute_command("CLIENT", "PAUSE", int(FAULT_SECONDS * 1000), mode)
        end_fault: Callable[[], None] = lambda: None  # noqa: E731 - it ends by itself
    else:
        app.pause()
        timer = threading.Timer(FAULT_SECONDS, app.resume)
        timer.start()
        end_fault = timer.join
    started = time.monotonic()
    during = {
        "rl": browser.request("get", "/rl/"),
        "sess": browser.request("get", "/sess/"),
    }
    still_faulted = time.monotonic() - started < FAULT_SECONDS - 0.2
    end_fault()
    time.sleep(max(0.0, FAULT_SECONDS - (time.monotonic() - started)) + 0.3)
    assert still_faulted, "the requests outlasted the fault; the test would prove nothing"
    assert during["rl"].status_code == 200
    assert during["sess"].status_code == 503 and not cookie_deleted(during["sess"])

    # Nothing was lost: the same session continues where it was.
    after = browser.everything()
    assert after["sess"].status_code == 200 and after["sess"].json() == {"n": 2}
    assert browser.client.cookies["sessionid"].value == session_cookie
    assert after["rl"].status_code == 200 and after["job"].status_code == 200
    # the idempotent request replays its stored answer; the view ran once in all
    assert after["charge"].status_code == 201
    assert after["charge"].content == before["charge"].content
    assert after["charge"]["Idempotent-Replayed"] == "true"
    assert urls_faults.RUNS["charge"] == 1
    assert after["cache"].json() == {"report": 1}  # still the cached value


@pytest.mark.parametrize("fault", ["client_pause", "sigstop"])
def test_idempotent_request_timing_out_mid_claim_runs_at_most_once(
    app: RedisServer, fault: str
) -> None:
    """A request that timed out while Redis hung: its claim may still be applied after the
    client gave up (F4). A retry then either runs the view (the claim never landed) or gets
    409 + Retry-After until the orphan claim's lease (2 s here) ends, then runs it. Either
    way: exactly one run, a replay afterwards, never a hang."""
    browser = Browser()
    admin = app.client()
    if fault == "client_pause":
        admin.execute_command("CLIENT", "PAUSE", int(FAULT_SECONDS * 1000), "ALL")
    else:
        app.pause()
        threading.Timer(FAULT_SECONDS, app.resume).start()
    first = browser.request("post", "/charge/", **{"Idempotency-Key": "order-9"})
    assert first.status_code == 503 and urls_faults.RUNS["charge"] == 0
    time.sleep(FAULT_SECONDS + 0.3)

    answers = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        response = browser.request("post", "/charge/", **{"Idempotency-Key": "order-9"})
        answers.append(response.status_code)
        if response.status_code == 201:
            break
        assert response.status_code == 409 and int(response["Retry-After"]) >= 1
        time.sleep(0.2)
    assert answers[-1] == 201, answers
    again = browser.request("post", "/charge/", **{"Idempotency-Key": "order-9"})
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert urls_faults.RUNS["charge"] == 1


def test_rate_limit_fail_closed_answers_503_within_the_bound(app: RedisServer) -> None:
    from tests import settings as base

    browser = Browser()
    with override_settings(REDIS_PATTERNS={
            **base.REDIS_PATTERNS, "CONNECTION": app.url, "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
            "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT, "RATELIMIT": {"FAIL_OPEN": False}}):
        connection.reset_clients()
        assert browser.request("get", "/rl/").status_code == 200
        app.pause()
        try:
            response = browser.request("get", "/rl/")
        finally:
            app.resume()
        assert response.status_code == 503
        assert browser.request("get", "/rl/").status_code == 200
    connection.reset_clients()


@pytest.mark.parametrize(
    ("feature", "method", "path", "status", "ran"),
    [
        # the view changed the session, then Redis died before the save: 503, cookie kept
        ("sess", "get", "/sess/", 503, None),
        # the view ran (its side effect is real) but its answer could not be stored: the
        # client still gets the real response; a retry may run it again (at least once)
        ("charge", "post", "/charge/", 201, "charge"),
        # the value was computed; storing it failed (logged): served anyway
        ("compute", "get", "/cache/", 200, "compute"),
        # the job ran inside the lock; the release failed: leaving the block raises
        # BackendUnavailable (the lease ends by its TTL), so the caller learns it
        ("job", "post", "/job/", 503, "job"),
    ],
)
def test_redis_killed_in_the_middle_of_each_operation(
    app: RedisServer, feature: str, method: str, path: str, status: int, ran: str | None
) -> None:
    browser = Browser()
    assert browser.request("get", "/sess/").status_code == 200
    urls_faults.RUNS.clear()
    urls_faults.HOOKS[feature] = app.kill  # SIGKILL from inside the operation
    headers = {"Idempotency-Key": "mid-1"} if feature == "charge" else {}
    response = browser.request(method, path, **headers)
    assert response.status_code == status, response.content
    assert not cookie_deleted(response)
    if ran is not None:
        assert urls_faults.RUNS[ran] == 1
    app.start()
    again = browser.request(method, path, **headers)
    assert again.status_code in (200, 201)  # recovered without an app restart
    if feature == "charge":  # nothing was stored: the retry runs the view again
        assert urls_faults.RUNS["charge"] == 2


@contextlib.contextmanager
def demoted(server: RedisServer, new_primary: RedisServer) -> Iterator[None]:
    """``server`` is a read-only replica of ``new_primary`` for the block (READONLY writes)."""
    admin = server.client()
    admin.execute_command("REPLICAOF", "127.0.0.1", new_primary.port)
    try:
        wait_for(lambda: admin.info("replication")["master_link_status"] == "up", 10,
                 "the demoted server to sync")
        yield
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")


def test_demoted_primary_behind_a_plain_url_follows_each_policy_and_recovers(
    app: RedisServer, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """FO-07: the server behind a plain ``redis://`` URL becomes a replica (``READONLY``
    for every write). Each feature answers by its outage policy — no 500, no permanent
    READONLY state — and everything works again once it is a primary again."""
    browser = Browser()
    assert_healthy_before(browser)
    with demoted(app, redis_server_factory()):
        during = browser.everything()
        assert during["rl"].status_code == 200  # fail open
        assert during["sess"].status_code == 503 and not cookie_deleted(during["sess"])
        assert during["charge"].status_code in (201, 503)  # replay is a read; a claim is not
        assert during["job"].status_code == 503  # locks fail closed
        # (the cache is checked in test_cache_degrades_when_the_primary_is_demoted)
    after = browser.everything()
    assert after["rl"].status_code == 200 and after["job"].status_code == 200
    assert after["sess"].status_code == 200  # (the data went with the resync: a new session)
    assert after["cache"].status_code == 200


def test_cache_degrades_when_the_primary_is_demoted(
    app: RedisServer, redis_server_factory: Callable[..., RedisServer]
) -> None:
    browser = Browser()
    assert browser.request("get", "/cache/").status_code == 200
    with demoted(app, redis_server_factory()):
        assert browser.request("get", "/cache/").status_code == 200


def test_connection_churn_costs_no_errors_and_no_duplicates(app: RedisServer) -> None:
    """FO-09: every client connection is killed every 100 ms under load. A stale pooled
    socket is retried once (a connection error means the command was not read), so hits
    succeed; counts stay exact (no hit counted twice); no connections leak."""
    from django_redispatterns.exceptions import BackendUnavailable
    from django_redispatterns.ratelimit import RateLimiter

    limiter = RateLimiter("1000000/m", algorithm="fixed_window")
    limiter.hit("warm-up")
    admin = app.client()
    baseline = admin.info("clients")["connected_clients"]
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            stop.wait(0.1)

    tally = {"ok": 0, "errors": 0}
    lock = threading.Lock()

    def traffic() -> None:
        for _ in range(150):
            try:
                limiter.hit("churn")
                outcome = "ok"
            except BackendUnavailable:
                outcome = "errors"
            with lock:
                tally[outcome] += 1

    killer = threading.Thread(target=churn)
    killer.start()
    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    stop.set()
    killer.join(10)
    state = limiter.peek("churn")
    counted = state.limit - state.remaining
    assert tally["ok"] + tally["errors"] == 600
    assert tally["ok"] <= counted <= tally["ok"] + tally["errors"], (tally, counted)
    assert tally["errors"] <= 30, tally  # a connection error is retried once
    assert admin.info("clients")["connected_clients"] <= baseline + 8  # no leak
