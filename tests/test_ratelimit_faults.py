"""Rate limiting when Redis is down, paused, out of memory or lost its scripts."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import AsyncClient, Client, override_settings

from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.ratelimit import RateLimiter
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.urls("tests.urls_ratelimit")

LOGGER = "django_redispatterns.ratelimit"


def patterns(url: str, fail_open: bool) -> Any:
    return override_settings(REDIS_PATTERNS={
        "CONNECTION": "default", "KEY_PREFIX": "rptest",
        "SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5,
        "RATELIMIT": {"CONNECTION": url, "FAIL_OPEN": fail_open},
    })


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    yield redis_server_factory()


def get_timed(path: str) -> tuple[int, float, Any]:
    started = time.monotonic()
    response = Client().get(path, HTTP_ACCEPT="application/json")
    return response.status_code, time.monotonic() - started, response


async def aget_timed(path: str) -> tuple[int, float, Any]:
    started = time.monotonic()
    response = await AsyncClient().get(path, HTTP_ACCEPT="application/json")
    return response.status_code, time.monotonic() - started, response


def check_policy(fault: Callable[[RedisServer], None], server: RedisServer, caplog: Any) -> None:
    fault(server)
    for fail_open, expected in ((True, 200), (False, 503)):
        with patterns(server.url, fail_open), caplog.at_level(logging.WARNING, logger=LOGGER):
            caplog.clear()
            status, took, response = get_timed("/fixed/")
            assert status == expected  # never 500 (django-ratelimit: 500 with FAIL_OPEN)
            assert took < 3.0  # bounded by the socket timeouts, never a hung request
            if not fail_open:
                assert response["Retry-After"] == "1"
                assert response.json()["status"] == 503
            astatus, atook, _ = asyncio.run(aget_timed("/async-fixed/"))
            assert astatus == expected and atook < 3.0
            assert "backend unavailable" in caplog.text
            assert "RateLimit" not in response  # no invented numbers


def test_killed_server(server: RedisServer, caplog: Any) -> None:
    check_policy(RedisServer.kill, server, caplog)


def test_sigstopped_server(server: RedisServer, caplog: Any) -> None:
    try:
        check_policy(RedisServer.pause, server, caplog)
    finally:
        server.resume()


def test_client_pause(server: RedisServer, caplog: Any) -> None:
    check_policy(lambda s: s.client().execute_command("CLIENT", "PAUSE", 20000, "ALL"),
                 server, caplog)  # the fixture kills the paused server


def test_out_of_memory_follows_the_policy(server: RedisServer, caplog: Any) -> None:
    def fill(s: RedisServer) -> None:
        c = s.client()
        c.set("ballast", "x" * 200_000)
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", 1)

    check_policy(fill, server, caplog)


def test_timed_out_hit_counts_at_most_once(server: RedisServer) -> None:
    """RL-06: a call that timed out while the server was paused may run later, once."""
    with patterns(server.url, True):
        limiter = RateLimiter("10/m", algorithm="fixed_window", group="timeout")
        assert limiter.hit("c").remaining == 9
        server.pause()
        try:
            with pytest.raises(BackendUnavailable):
                limiter.hit("c")
        finally:
            server.resume()
        time.sleep(0.2)
        remaining = limiter.peek("c").remaining
    assert remaining in (8, 9)


def resending_alias(server: RedisServer) -> Any:
    """CACHES["resending"]: a django-redis alias whose own client re-sends a timed-out call
    up to 3 times (a common set-up; redis-py 5 needs the retry_on_error list)."""
    from django.conf import settings
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return override_settings(CACHES={**settings.CACHES, "resending": {
        "BACKEND": "django_redis.cache.RedisCache",
        # a URL of its own: django-redis shares pools per URL across the process
        "LOCATION": f"{server.url}?client_name=rl-resend-{server.port}-{time.time_ns()}",
        "OPTIONS": {"SOCKET_TIMEOUT": 0.3, "CONNECTION_POOL_KWARGS": {
            "retry": Retry(NoBackoff(), 3), "retry_on_timeout": True,
            "retry_on_error": [redis.TimeoutError]}},
    }})


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "token_bucket"])
def test_timed_out_decision_is_never_resent(server: RedisServer, algorithm: str) -> None:
    """Decisions run on a client that never re-sends, even when the connection's
    own client would. A hit that times out while the server hangs raises (the caller's
    FAIL_OPEN policy then applies) and counts at most once; a re-sending client would get
    an answer after the server resumes and count the hit twice or more."""
    with resending_alias(server), patterns("resending", True):
        limiter = RateLimiter("10/m", algorithm=algorithm, group="resend")
        assert limiter.hit("c").remaining == 9  # also loads the script
        server.pause()
        timer = threading.Timer(0.8, server.resume)  # within a re-sending client's retries
        timer.start()
        try:
            with pytest.raises(BackendUnavailable):
                limiter.hit("c")
        finally:
            timer.join()
        time.sleep(0.5)  # let the sent copy run
        assert limiter.peek("c").remaining in (8, 9)

        async def ahit() -> None:
            server.pause()
            resume = asyncio.get_running_loop().call_later(0.8, server.resume)
            try:
                with pytest.raises(BackendUnavailable):
                    await limiter.ahit("c")
            finally:
                await asyncio.sleep(0.9)
                resume.cancel()
                server.resume()

        before = limiter.peek("c").remaining
        asyncio.run(ahit())
        time.sleep(0.5)
        assert limiter.peek("c").remaining in (before - 1, before)


def test_timed_out_request_fails_open_and_counts_at_most_once(server: RedisServer) -> None:
    with resending_alias(server), patterns("resending", True):
        server.pause()
        timer = threading.Timer(0.8, server.resume)  # within a re-sending client's retries
        timer.start()
        try:
            status, took, response = get_timed("/fixed/")  # 2/m
        finally:
            timer.join()
        assert status == 200 and took < 3.0  # FAIL_OPEN
        assert "RateLimit-Remaining" not in response  # no decision: Redis did not answer
        time.sleep(0.5)
        status, _, response = get_timed("/fixed/")
        assert status == 200  # the timed-out hit counted at most once
        assert response["RateLimit-Remaining"] in ("0", "1")


def test_recovers_after_restart_and_script_flush(server: RedisServer) -> None:
    with patterns(server.url, True):
        limiter = RateLimiter("3/m", algorithm="sliding_window", group="restart")
        assert limiter.hit("c").allowed
        server.restart()
        deadline = time.monotonic() + 5
        while True:  # the first call after a restart may meet a stale pooled socket
            try:
                decision = limiter.hit("c")
                break
            except BackendUnavailable:
                assert time.monotonic() < deadline
        assert decision.allowed and decision.remaining == 2  # state was lost with the server
        server.client().script_flush()
        assert limiter.hit("c").remaining == 1  # NOSCRIPT -> EVAL, counted once


def test_drf_throttle_fails_open_and_closed(server: RedisServer) -> None:
    server.kill()
    from rest_framework.settings import api_settings

    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"tests": "1/min"}}):
        api_settings.reload()
        with patterns(server.url, True):
            assert Client().get("/drf/").status_code == 200
        with patterns(server.url, False):
            assert Client().get("/drf/").status_code == 503
    api_settings.reload()


def test_redis_errors_other_than_unavailability_are_not_swallowed(
        redis_client: redis.Redis) -> None:
    limiter = RateLimiter("3/m", group="wrongtype")
    redis_client.delete(limiter.key("c"))
    redis_client.lpush(limiter.key("c"), "x")  # the wrong type: a bug, not an outage
    redis_client.expire(limiter.key("c"), 60)
    with pytest.raises(redis.ResponseError):
        limiter.hit("c")
