"""Idempotency under concurrency: real threads, real processes, crashed and slow holders.

Regressions of django-idempotency-key 1.3.0 (ANCHORS 3, RELIABILITY F16) are marked DIK.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import Client

from django_redispatterns.idempotency import Claim, Fingerprint, IdempotencyStore, heartbeat
from tests.redis_servers import KEY_PREFIX
from tests.urls_idempotency import child_hold, child_send, idem_settings, post, runs

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[Client]:
    with idem_settings():
        yield Client()


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def in_threads(n: int, send: Callable[[int], Any]) -> list[Any]:
    """Run ``send(i)`` in ``n`` threads released together by a barrier."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def work(i: int) -> None:
        barrier.wait(10)
        results[i] = send(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_ten_threads_same_key_slow_view_runs_once(redis_client: redis.Redis) -> None:
    with idem_settings():
        responses = in_threads(10, lambda i: post(Client(), "/charge/?sleep=0.5"))
        after = post(Client(), "/charge/?sleep=0.5")
    statuses = sorted(r.status_code for r in responses)
    assert runs(redis_client, "charge:start") == 1
    firsts = [r for r in responses if r.status_code == 201 and "Idempotent-Replayed" not in r]
    assert len(firsts) == 1
    for r in responses:
        if r is firsts[0]:
            continue
        assert r.status_code == 409 or r["Idempotent-Replayed"] == "true", statuses
        if r.status_code == 409:
            assert int(r["Retry-After"]) >= 1
    assert after.content == firsts[0].content and after["Idempotent-Replayed"] == "true"


@pytest.fixture
def spawn_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Spawned children inherit the parent's Redis: their tests.settings may load early
    (importing the worker's module pulls in DRF, which reads settings)."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    return redis_url


def test_dik_eight_concurrent_processes_run_the_view_once(spawn_env: str,
                                                          redis_client: redis.Redis) -> None:
    # DIK: 8 concurrent requests with one key ran its view 8 times.
    redis_url = spawn_env
    n = 4
    barrier = SPAWN.Barrier(n)
    queue = SPAWN.Queue()
    procs = [SPAWN.Process(target=child_send,
                           args=(redis_url, "/charge/?sleep=0.3", "dik-8", barrier, queue, 2))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(30)
    flat = [item for statuses in results for item in statuses]
    assert len(flat) == 8
    assert runs(redis_client, "charge:start") == 1
    assert [s for s, replayed in flat if s == 201 and replayed is None] == [201]
    assert all(s == 409 or replayed == "true" for s, replayed in flat if s != 201 or replayed)


def test_dik_retry_50ms_into_a_running_request_is_409(client: Client,
                                                      redis_client: redis.Redis) -> None:
    # DIK: a retry arriving 50 ms into an in-flight request ran the view a second time.
    first: list[Any] = []
    t = threading.Thread(target=lambda: first.append(post(Client(), "/charge/?sleep=1.5")))
    t.start()
    wait_for(lambda: runs(redis_client, "charge:start") == 1)
    time.sleep(0.05)
    retry = post(client, "/charge/?sleep=1.5")
    t.join(30)
    assert retry.status_code == 409 and retry["Retry-After"] == "1"
    assert retry["Content-Type"] == "application/problem+json"
    assert runs(redis_client, "charge:start") == 1
    replay = post(client, "/charge/?sleep=1.5")
    assert replay.status_code == 201 and replay.content == first[0].content  # DIK answered 409


def test_dik_unrelated_keys_are_not_blocked_by_one_global_lock(redis_client: redis.Redis) -> None:
    # DIK: simultaneous requests with *different* keys got 423 from one global lock.
    started = time.monotonic()
    with idem_settings():
        responses = in_threads(4, lambda i: post(Client(), "/charge/?sleep=1", key=f"k{i}"))
    elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [201] * 4
    assert runs(redis_client, "charge") == 4
    assert elapsed < 3.5  # they ran side by side (4 x 1 s in series would be 4 s)


def test_crashed_holder_blocks_until_its_lease_ends_then_the_retry_runs(
    spawn_env: str, redis_client: redis.Redis
) -> None:
    redis_url = spawn_env
    lease = 2.0
    proc = SPAWN.Process(target=child_hold,
                         args=(redis_url, "/charge/?sleep=60", "crash-1"), kwargs={"LEASE": lease})
    proc.start()
    try:
        wait_for(lambda: runs(redis_client, "charge:start") == 1, timeout=60)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)  # the worker dies mid-view, its claim stays behind
        proc.join(10)
        with idem_settings(LEASE=lease):
            blocked = post(Client(), "/charge/?sleep=60", key="crash-1")
            assert blocked.status_code == 409  # at most once while the lease holds
            [key] = redis_client.scan_iter(match=f"{KEY_PREFIX}:idem:*")
            assert 0 < redis_client.pttl(key) <= lease * 1000
            wait_for(lambda: redis_client.exists(key) == 0, timeout=lease + 10)
            retry = post(Client(), "/charge/?sleep=0", key="crash-1")
    finally:
        if proc.is_alive():
            proc.kill()
    # Same key, but the query differs from the crashed request: the lease ended, so the key
    # is free again and the retry runs (at least once after a crash).
    assert retry.status_code == 201 and retry.get("Idempotent-Replayed") is None
    assert runs(redis_client, "charge:start") == 2


def test_expired_lease_frees_the_key(client: Client, redis_client: redis.Redis) -> None:
    store = IdempotencyStore("default")
    fp = Fingerprint.of("POST", "/charge/", "", "application/json", b'{"amount": 100}')
    claim = store.begin("alice", "k1", fp, lease=1.5)
    assert isinstance(claim, Claim)
    heartbeat.unwatch(claim)  # its process "died": nobody renews the lease any more
    assert post(client, "/charge/").status_code == 409
    wait_for(lambda: redis_client.exists(claim.redis_key) == 0)
    assert post(client, "/charge/").status_code == 201
    assert runs(redis_client, "charge") == 1


def test_heartbeat_keeps_a_long_view_exclusive(redis_client: redis.Redis) -> None:
    lease = 1.0  # renewed every ~0.33 s: tolerates 0.67 s of scheduling delay on a busy box
    with idem_settings(LEASE=lease):
        first: list[Any] = []
        t = threading.Thread(target=lambda: first.append(post(Client(), "/charge/?sleep=3.4")))
        t.start()
        wait_for(lambda: runs(redis_client, "charge:start") == 1)
        duplicates = []
        for _ in range(2):  # at ~1.2x and ~2.4x the lease: only renewals keep the claim
            time.sleep(lease * 1.2)
            assert t.is_alive()
            duplicates.append(post(Client(), "/charge/?sleep=3.4").status_code)
        t.join(30)
        replay = post(Client(), "/charge/?sleep=3.4")
    assert duplicates == [409, 409]
    assert runs(redis_client, "charge:start") == 1
    assert replay["Idempotent-Replayed"] == "true" and replay.content == first[0].content


def test_claim_lost_mid_view_is_logged_and_not_stored(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with idem_settings(), caplog.at_level(logging.WARNING, "django_redispatterns.idempotency"):
        first: list[Any] = []
        t = threading.Thread(target=lambda: first.append(post(Client(), "/charge/?sleep=1.5")))
        t.start()
        wait_for(lambda: runs(redis_client, "charge:start") == 1)
        for key in redis_client.scan_iter(match=f"{KEY_PREFIX}:idem:*"):  # an operator deletes it
            redis_client.delete(key)
        t.join(30)
        assert first[0].status_code == 201  # the client still gets its answer
        assert "ended before the view finished" in caplog.text
        assert list(redis_client.scan_iter(match=f"{KEY_PREFIX}:idem:*")) == []
        assert post(Client(), "/charge/?sleep=0").status_code == 201


def test_heartbeat_serves_async_views_too(redis_client: redis.Redis) -> None:
    import asyncio

    from django.test import AsyncClient

    lease = 1.0

    async def scenario() -> list[int]:
        client = AsyncClient()
        headers = {"Idempotency-Key": "async-long", "X-Test-User": "alice"}

        async def send() -> Any:
            return await client.post("/acharge/?sleep=3.6", "{}",
                                     content_type="application/json", headers=headers)

        first = asyncio.ensure_future(send())
        statuses = []
        for _ in range(2):  # at ~1.2x and ~2.4x the lease
            await asyncio.sleep(lease * 1.2)
            statuses.append((await send()).status_code)
        statuses.append((await first).status_code)
        statuses.append((await send()).status_code)
        return statuses

    with idem_settings(LEASE=lease):
        statuses = asyncio.run(scenario())
    assert statuses == [409, 409, 201, 201]
    assert runs(redis_client, "acharge:start") == 1
