"""Idempotency when Redis fails or holds data we did not write (fail closed)."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import AsyncClient, Client

from django_redispatterns.idempotency import IdempotencyStore
from tests.redis_servers import RedisServer
from tests.urls_idempotency import idem_settings, post, runs

LOGGER = "django_redispatterns.idempotency"


def on(server: RedisServer) -> Any:
    """Idempotency on a throwaway server, with short socket timeouts."""
    return idem_settings(top={"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5},
                         CONNECTION=server.url)


def test_redis_killed_is_503_with_retry_after_and_the_view_does_not_run(
    redis_server_factory: Callable[..., RedisServer], redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = redis_server_factory()
    with on(server), caplog.at_level(logging.ERROR, LOGGER):
        client = Client()
        assert post(client, "/charge/", key="before").status_code == 201
        server.kill()
        started = time.monotonic()
        response = post(client, "/charge/", key="after")
        elapsed = time.monotonic() - started
        replay = post(client, "/charge/", key="before")  # a replay needs Redis as well
    assert response.status_code == 503 and replay.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert json.loads(response.content)["code"] == "idempotency_unavailable"
    assert runs(redis_client, "charge:start") == 1
    assert "fail closed" in caplog.text
    assert elapsed < 5


def test_redis_hung_is_503_within_the_socket_timeout(
    redis_server_factory: Callable[..., RedisServer], redis_client: redis.Redis
) -> None:
    server = redis_server_factory()
    with on(server):
        client = Client()
        post(client, "/charge/", key="warm")  # a pooled connection exists before the hang
        server.pause()
        try:
            started = time.monotonic()
            response = post(client, "/charge/", key="hung")
            elapsed = time.monotonic() - started
        finally:
            server.resume()
    assert response.status_code == 503
    assert elapsed < 5
    assert runs(redis_client, "charge:start") == 1


def test_async_redis_down_is_503(redis_server_factory: Callable[..., RedisServer],
                                 redis_client: redis.Redis) -> None:
    server = redis_server_factory()
    server.kill()

    async def send() -> Any:
        return await AsyncClient().post("/acharge/", "{}", content_type="application/json",
                                        headers={"Idempotency-Key": "k", "X-Test-User": "a"})

    with on(server):
        response = asyncio.run(send())
    assert response.status_code == 503 and "Retry-After" in response
    assert runs(redis_client, "acharge:start") == 0


def test_redis_lost_after_the_view_ran_returns_the_response_and_logs(
    redis_server_factory: Callable[..., RedisServer], redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = redis_server_factory()
    with on(server), caplog.at_level(logging.ERROR, LOGGER):
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(
            post(Client(), "/charge/?sleep=1.5", key="mid")))
        t.start()
        deadline = time.monotonic() + 15
        while runs(redis_client, "charge:start") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.kill()
        t.join(30)
    assert result[0].status_code == 201  # the work is done: the client gets its answer
    assert "was not stored" in caplog.text


def test_script_cache_flushed_mid_request_still_completes(client_settings: None,
                                                          own_redis: redis.Redis) -> None:
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(post(Client(), "/charge/?sleep=1")))
    t.start()
    deadline = time.monotonic() + 15
    while runs(own_redis, "charge:start") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    own_redis.script_flush()
    t.join(30)
    again = post(Client(), "/charge/?sleep=1")
    assert again["Idempotent-Replayed"] == "true" and again.content == result[0].content


@pytest.fixture
def client_settings(redis_client: redis.Redis) -> Any:
    with idem_settings():
        yield


class _Marker:
    path: Path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))


@pytest.mark.parametrize("kind", ["garbage", "pickle", "truncated", "hash"])
def test_foreign_or_corrupt_record_is_409_never_executed(
    client_settings: None, redis_client: redis.Redis, tmp_path: Path, kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key, _ = IdempotencyStore.redis_key("alice", "k1")
    marker = _Marker()
    marker.path = tmp_path / "pwned"
    if kind == "hash":
        redis_client.hset(key, "a", "b")
        redis_client.expire(key, 60)
    else:
        value = {
            "garbage": b"\x00\x01not ours",
            "pickle": pickle.dumps(marker),
            "truncated": b'D POST.x.y {"s": 201, "h": [\n',
        }[kind]
        redis_client.set(key, value, ex=60)
    with caplog.at_level(logging.ERROR, LOGGER):
        response = post(Client(), "/charge/")
    assert response.status_code == 409
    assert "unreadable" in json.loads(response.content)["detail"]
    assert "unreadable" in caplog.text or "wrong Redis type" in caplog.text
    assert not marker.path.exists()
    assert runs(redis_client, "charge:start") == 0


def test_redis_out_of_memory_is_503_and_the_view_does_not_run(
    redis_server_factory: Callable[..., RedisServer], redis_client: redis.Redis
) -> None:
    server = redis_server_factory()
    admin = server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write is now refused with OOM
    with on(server):
        response = post(Client(), "/charge/", key="oom")
    assert response.status_code == 503 and "Retry-After" in response
    assert runs(redis_client, "charge:start") == 0
