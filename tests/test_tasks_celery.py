"""Locks, rate limits and enqueue-once on Celery: real worker processes on a real Redis
broker (a private redis-server), one worker killed with SIGKILL mid-task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("celery", reason="the celery extra is not installed")

from django_redispatterns.contrib import celery as contrib_celery
from django_redispatterns.exceptions import (
    IdempotencyKeyReused,
    LockNotAcquired,
    RateLimited,
)
from django_redispatterns.locks import Lock, held_key
from tests.redis_servers import RedisServer
from tests.task_defs import runs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A private redis-server as broker and result backend for this module's tests (the app
    keeps its connections and result backend, so one server for all of them)."""
    try:
        server = RedisServer()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    os.environ["CELERY_BROKER_URL"] = server.url
    from tests import celery_app

    celery_app.app.conf.broker_url = server.url
    celery_app.app.conf.result_backend = server.url
    try:
        yield server.url
    finally:
        celery_app.app.close()
        os.environ.pop("CELERY_BROKER_URL", None)
        server.stop()


def start_worker(redis_url: str, broker: str, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REDIS_URL": redis_url, "CELERY_BROKER_URL": broker,
           "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "--pool=solo",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{name}@%h",
         "--loglevel=WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)


def wait_for(client: redis.Redis, check: Any, seconds: float = 60) -> list[list[str]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check(runs(client)):
            return runs(client)
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting; runs so far: {runs(client)}")


def stop(procs: list[subprocess.Popen[str]]) -> str:
    output = []
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
        output.append(out or "")
    return "\n".join(output)


def test_called_directly_a_busy_lock_or_a_full_rate_raises(redis_client: redis.Redis) -> None:
    from tests import celery_app

    name = celery_app.hold.run.lock_name(celery_app.hold, "busy", 0)  # bound: self first
    with Lock(name, ttl=10), pytest.raises(LockNotAcquired):
        celery_app.hold("busy", 0)  # not in a worker: nothing to reschedule onto
    assert celery_app.limited("me") == "me"
    with pytest.raises(RateLimited):
        celery_app.limited("me")


def _double(x: int) -> int:
    return x * 2


def test_broker_down_enqueue_once_raises_and_a_retry_enqueues(
        redis_client: redis.Redis, broker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery import Celery
    from kombu.exceptions import OperationalError

    from tests import celery_app

    monkeypatch.delenv("CELERY_BROKER_URL")  # (it would override the broker given here)
    down = Celery("down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    down.conf.update(task_publish_retry=False, broker_connection_retry=False,
                     broker_connection_max_retries=0)
    unreachable = down.task(name=celery_app.plain.name)(_double)
    try:
        with pytest.raises(OperationalError):
            contrib_celery.enqueue_once(unreachable, 7, idempotency_key="job-7")
    finally:
        down.close()
    sent = contrib_celery.enqueue_once(celery_app.plain, 7, idempotency_key="job-7")
    assert sent.id  # the failed send released its claim: the retry was enqueued
    queued = redis.Redis.from_url(broker)
    assert queued.llen("celery") == 1
    queued.delete("celery")  # not for the workers of the next test


def test_workers_reschedule_rate_limit_enqueue_once_and_survive_a_kill(
        redis_client: redis.Redis, redis_url: str, broker: str) -> None:
    from tests import celery_app

    workers = [start_worker(redis_url, broker, f"w{i}") for i in range(2)]
    output = ""
    try:
        first = celery_app.hold.delay("k", 30)  # the run the kill interrupts
        seen = wait_for(redis_client, lambda r: any(e[:3] == ["start", "hold", "k"] for e in r))
        first_fence = int(seen[0][3])
        victim = next(w for w in workers if str(w.pid) == seen[0][4])
        # The same item while the first holds the lock: retried later, not dropped.
        second = celery_app.hold.delay("k", 0)
        once = contrib_celery.enqueue_once(celery_app.plain, 4, idempotency_key="job-4")
        again = contrib_celery.enqueue_once(celery_app.plain, 4, idempotency_key="job-4")
        assert again.id == once.id
        with pytest.raises(IdempotencyKeyReused):
            contrib_celery.enqueue_once(celery_app.plain, 5, idempotency_key="job-4")
        limited = [celery_app.limited.delay("u") for _ in range(3)]
        time.sleep(1.0)
        os.killpg(victim.pid, signal.SIGKILL)  # mid-task: no release, no clean-up
        killed_at = time.time()
        assert second.get(timeout=60) == int(next(
            e[3] for e in runs(redis_client) if e[:2] == ["end", "hold"]))
        assert once.get(timeout=60) == 8
        assert [r.get(timeout=60) for r in limited] == ["u", "u", "u"]
        # A lease lost while the body runs in the worker: LockLost is raised into it.
        lost = celery_app.hold.delay("lost", 20)
        wait_for(redis_client, lambda r: any(e[:3] == ["start", "hold", "lost"] for e in r))
        redis_client.delete(held_key(celery_app.hold.run.lock_name(celery_app.hold, "lost", 0)))
        with pytest.raises(Exception) as caught:
            lost.get(timeout=30)
        assert type(caught.value).__name__ == "LockLost", caught.value
        assert any(e[:3] == ["lost", "hold", "lost"] for e in runs(redis_client))
    finally:
        output = stop(workers)
    seen = runs(redis_client)
    end = next(e for e in seen if e[:2] == ["end", "hold"])
    assert int(end[3]) > first_fence, output  # a fresh acquisition after the kill
    assert float(end[5]) - killed_at < 30  # freed within the lease, not a long timeout
    assert first.id != second.id
    assert [e[:3] for e in seen if e[1] == "plain"] == [["ran", "plain", "4"]]
    ran = [float(e[5]) for e in seen if e[:2] == ["ran", "limited"]]
    assert len(ran) == 3 and ran[-1] - ran[0] >= 1.9  # 1 per 2 s window: deferred, all ran
