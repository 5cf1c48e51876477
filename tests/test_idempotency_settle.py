"""Every idempotent request settles: each way a request can end stores or frees its claim.

The endings: a response stored, a 5xx, an exception in the view (tests/test_idempotency.py),
and here the ones that happen *after* the view returned — a lazily rendered response
(``TemplateResponse``, DRF's ``Response``) whose rendering raises, one that is never
rendered at all, a view returning ``None`` — plus an async view cancelled because the
client hung up. Each is tried on the decorator and on the middleware, with sync and async
views, under Django's WSGI test client and its ASGI one. Afterwards no claim is left, no
lease is renewed, and a claim never outlives ``MAX_LEASE``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.test import AsyncClient, Client, override_settings

from django_redispatterns.idempotency import Claim, Fingerprint, IdempotencyStore, heartbeat
from tests.redis_servers import KEY_PREFIX, RedisServer
from tests.urls_idempotency import asgi_post, idem_settings, post, runs

LOGGER = "django_redispatterns.idempotency"


def record_keys(r: redis.Redis) -> list[bytes]:
    return list(r.scan_iter(match=f"{KEY_PREFIX}:idem:*"))


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        gc.collect()  # a response nobody rendered is freed when it is collected
        time.sleep(0.02)
    return True


def send_twice(url: str, asynchronous: bool) -> list[int]:
    """POST the same key twice (a retry of a failed request); the statuses."""
    if not asynchronous:
        client = Client(raise_request_exception=False)
        return [post(client, url).status_code for _ in range(2)]

    async def scenario() -> list[int]:
        aclient = AsyncClient(raise_request_exception=False)
        statuses = []
        for _ in range(2):
            response = await aclient.post(url, '{"amount": 100}', content_type="application/json",
                                          headers={"Idempotency-Key": "k1", "X-Test-User": "alice"})
            statuses.append(response.status_code)
        return statuses

    return asyncio.run(scenario())


# --- the endings after the view ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["render", "none", "raise", "500"])
@pytest.mark.parametrize("handler", ["wsgi", "asgi"])
@pytest.mark.parametrize("view", ["sync", "async"])
@pytest.mark.parametrize("via", ["settled", "plain"])  # the decorator / the middleware
def test_a_failed_request_frees_the_claim(redis_client: redis.Redis, via: str, view: str,
                                          handler: str, how: str) -> None:
    # The decorator used to leave the claims of "render" and "none" behind (409 for a day,
    # renewed for a day).
    with idem_settings():
        statuses = send_twice(f"/{via}/{view}/?how={how}", handler == "asgi")
    assert statuses == [500, 500]  # the retry ran the view again: not 409
    assert runs(redis_client, "ending" if view == "sync" else "aending") == 2
    assert record_keys(redis_client) == []


@pytest.mark.parametrize("how", ["ok", "template"])
@pytest.mark.parametrize("handler", ["wsgi", "asgi"])
@pytest.mark.parametrize("view", ["sync", "async"])
@pytest.mark.parametrize("via", ["settled", "plain"])
def test_a_response_is_stored_and_replayed(redis_client: redis.Redis, via: str, view: str,
                                           handler: str, how: str) -> None:
    with idem_settings():
        first, again = send_twice(f"/{via}/{view}/?how={how}", handler == "asgi")
    assert first == again == 201
    assert runs(redis_client, "ending" if view == "sync" else "aending") == 1  # replayed


def test_a_drf_response_that_cannot_be_rendered_frees_the_claim(redis_client: redis.Redis) -> None:
    def send() -> int:
        return Client(raise_request_exception=False).post(
            "/drf-render/", "{}", content_type="application/json",
            headers={"Idempotency-Key": "drf-r", "X-Api-User": "7"}).status_code

    with idem_settings(SCOPE=None):
        assert [send(), send()] == [500, 500]
    assert runs(redis_client, "drf-render") == 2
    assert record_keys(redis_client) == []


@pytest.fixture
def no_kept_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Django logs a 500 with its traceback, and pytest keeps log records (and through their
    traceback the dropped response) until the test ends; a server's log handler does not."""
    caplog.set_level(logging.CRITICAL, "django.request")


@pytest.mark.usefixtures("no_kept_tracebacks")
def test_a_lazy_response_that_is_never_rendered_frees_the_claim(redis_client: redis.Redis) -> None:
    # A later process_template_response raises: Django drops the view's response unrendered.
    from tests import settings as base

    middleware = [*base.MIDDLEWARE, "tests.urls_idempotency.RaisingTemplateMiddleware"]
    url = "/settled/sync/?how=template&fail-template-middleware=1"
    with idem_settings(), override_settings(MIDDLEWARE=middleware):
        client = Client(raise_request_exception=False)
        assert post(client, url).status_code == 500
        assert wait_for(lambda: record_keys(redis_client) == [])
        assert post(client, url).status_code == 500  # the retry runs: not 409
    assert runs(redis_client, "ending") == 2


# --- cancellation ------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["settled", "plain"])
def test_an_async_view_cancelled_by_a_disconnect_frees_the_claim(redis_client: redis.Redis,
                                                                 via: str) -> None:
    import django

    if django.VERSION < (5, 0):
        pytest.skip("Django 4.2 does not cancel a view when the client disconnects")

    async def scenario() -> tuple[Any, Any]:
        hung_up = await asgi_post(f"/{via}/async/", b"sleep=30",
                                  disconnect_when=lambda: runs(redis_client, "aending:start") >= 1)
        assert wait_for(lambda: record_keys(redis_client) == [])
        retry = await asgi_post(f"/{via}/async/", b"sleep=0")
        return hung_up, retry

    with idem_settings():
        hung_up, retry = asyncio.run(scenario())
    assert hung_up[0] is None  # nothing was sent: the view was cancelled
    assert retry[0] == 201  # the key was free again, not 409
    assert runs(redis_client, "aending:start") == 2


def test_a_decorated_async_view_cancelled_directly_frees_the_claim(
    redis_client: redis.Redis,
) -> None:
    from django.test import AsyncRequestFactory

    from tests.urls_idempotency import urlpatterns

    view = next(p.callback for p in urlpatterns if str(p.pattern) == "settled/async/")
    request = AsyncRequestFactory().post("/settled/async/?sleep=30", "{}",
                                         content_type="application/json",
                                         headers={"Idempotency-Key": "c1", "X-Test-User": "al"})

    async def scenario() -> None:
        task = asyncio.ensure_future(view(request))
        while runs(redis_client, "aending:start") == 0:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with idem_settings():
        asyncio.run(scenario())
        assert wait_for(lambda: record_keys(redis_client) == [])


# --- nothing keeps running afterwards ---------------------------------------------------------


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("evalsha", "eval"))


@pytest.mark.usefixtures("no_kept_tracebacks")
def test_no_script_call_keeps_running_after_failed_requests(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    # 300 failed requests used to leave 300 claims renewed every LEASE/3 with no traffic.
    server = redis_server_factory()
    watcher = redis.Redis.from_url(server.url, socket_timeout=5)
    from tests import settings as base

    middleware = [*base.MIDDLEWARE, "tests.urls_idempotency.RaisingTemplateMiddleware"]
    lease = 0.6  # a renewal every 0.2 s while a claim is held
    with idem_settings(LEASE=lease, CONNECTION=server.url), override_settings(
            MIDDLEWARE=middleware):
        client = Client(raise_request_exception=False)
        for i in range(5):
            for url in ("/settled/sync/?how=render", "/settled/sync/?how=none",
                        "/settled/async/?how=render", "/settled/async/?how=none",
                        "/settled/sync/?how=template&fail-template-middleware=1"):
                assert post(client, url, key=f"fail-{i}").status_code == 500
        assert wait_for(lambda: watcher.dbsize() == 0)  # every claim freed
        time.sleep(lease)  # a heartbeat beat that was due runs out
        before = _script_calls(watcher)
        time.sleep(lease * 3)  # several beats
        after = _script_calls(watcher)
    watcher.close()
    assert after == before, f"{after - before} script calls with no traffic"
    ours = {IdempotencyStore.redis_key("alice", f"fail-{i}")[0] for i in range(5)}
    assert not ours & heartbeat.watched_keys()


# --- the bound on a claim's life --------------------------------------------------------------


def test_a_claim_is_never_renewed_past_max_lease(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lease, max_lease = 0.6, 2.0
    with idem_settings(LEASE=lease, MAX_LEASE=max_lease), caplog.at_level(logging.WARNING,
                                                                            LOGGER):
        started = time.monotonic()
        done: list[Any] = []
        t = threading.Thread(target=lambda: done.append(post(Client(), "/charge/?sleep=5")))
        t.start()
        latest_expiry = 0.0
        deadline = started + max_lease + 5
        seen = False
        while time.monotonic() < deadline:
            keys = record_keys(redis_client)
            if keys:
                seen = True
                pttl = redis_client.pttl(keys[0])
                if pttl > 0:
                    latest_expiry = max(latest_expiry, time.monotonic() + pttl / 1000)
            elif seen:
                break
            time.sleep(0.02)
        gone_at = time.monotonic()
        assert t.is_alive()  # the view still runs, but its claim has ended
        t.join(30)
    assert seen and not record_keys(redis_client)
    assert latest_expiry <= started + max_lease + 0.5  # never renewed past the bound
    assert gone_at <= started + max_lease + 3
    assert "maximum lease" in caplog.text
    assert done[0].status_code == 201  # the client still gets its answer; it is not stored


def test_max_lease_bounds_a_store_claim_nobody_settles(redis_client: redis.Redis) -> None:
    store = IdempotencyStore("default")
    fp = Fingerprint.of("POST", "/job/", "", "application/json", b"{}")
    started = time.monotonic()
    claim = store.begin("worker", "job-1", fp, lease=0.6, max_lease=1.5)
    assert isinstance(claim, Claim)
    assert redis_client.exists(claim.redis_key)
    assert wait_for(lambda: not redis_client.exists(claim.redis_key), timeout=10)
    assert time.monotonic() - started <= 1.5 + 3
    assert claim.redis_key not in heartbeat.watched_keys()


@pytest.mark.parametrize(("section", "named"), [
    ({"MAX_LEASE": 0}, "MAX_LEASE"),
    ({"LEASE": 30, "MAX_LEASE": 10}, "MAX_LEASE"),
])
def test_bad_max_lease_names_the_key(redis_client: redis.Redis, section: dict[str, Any],
                                     named: str) -> None:
    from django_redispatterns.exceptions import ConfigurationError

    with idem_settings(**section), pytest.raises(ConfigurationError, match=named):
        post(Client(), "/charge/")
