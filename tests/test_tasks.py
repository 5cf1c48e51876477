"""Locks, rate limits and enqueue-once on Django's tasks: the immediate backend in this
process (with threads), and the database backend with real ``db_worker`` processes,
one of them killed mid-task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import redis

if find_spec("django.tasks") is None:  # built in from Django 6.0, else the backport
    pytest.importorskip("django_tasks", reason="the tasks extra (django-tasks) is not installed")

from django_redispatterns.contrib import tasks as contrib_tasks
from django_redispatterns.exceptions import (
    AlreadyEnqueued,
    IdempotencyKeyReused,
    LockLost,
    LockNotAcquired,
    RateLimited,
)
from django_redispatterns.locks import Lock, held_key
from tests import django_tasks_defs as defs
from tests.task_defs import runs

ROOT = Path(__file__).resolve().parent.parent


def lock_name(task: Any, item: str) -> str:
    return str(task.func.lock_name(item, 0.0))


def failure(result: Any) -> str:
    assert result.errors, f"expected a failed result, got {result.status}"
    return str(result.errors[-1].exception_class_path)


# --- the immediate backend ------------------------------------------------------------------


def test_locked_task_runs_with_a_growing_fencing_token(redis_client: redis.Redis) -> None:
    first = defs.hold_or_fail.enqueue("a", 0)
    second = defs.hold_or_fail.enqueue("a", 0)
    assert first.status == "SUCCESSFUL" and second.status == "SUCCESSFUL"
    assert second.return_value > first.return_value > 0
    assert not redis_client.exists(held_key(lock_name(defs.hold_or_fail, "a")))


@pytest.mark.parametrize("task, expected", [
    ("hold_or_fail", "failed"),   # on_busy="raise"
    ("hold", "failed"),           # "reschedule", but the immediate backend cannot defer
    ("once_at_a_time", "skipped"),
])
def test_a_busy_lock_raises_or_skips(redis_client: redis.Redis, task: str,
                                     expected: str) -> None:
    the_task = getattr(defs, task)
    with Lock(lock_name(the_task, "busy"), ttl=10):
        result = the_task.enqueue("busy", 0)
        other_item = the_task.enqueue("free", 0)  # another argument: another lock
    assert other_item.status == "SUCCESSFUL"
    if expected == "failed":
        assert failure(result).endswith("LockNotAcquired")
    else:
        assert result.status == "SUCCESSFUL" and result.return_value is None
    assert [r[2] for r in runs(redis_client) if r[0] == "start"] == ["free"]


def test_a_waiting_run_gets_the_lock_when_the_holder_releases_it(
        redis_client: redis.Redis) -> None:
    holder = Lock(lock_name(defs.hold_waiting, "w"), ttl=10)
    assert holder.acquire()
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(defs.hold_waiting.enqueue("w", 0)))
    waiter.start()
    time.sleep(0.5)
    assert runs(redis_client) == []  # still waiting
    holder.release()
    waiter.join(30)
    assert results[0].status == "SUCCESSFUL"
    assert results[0].return_value > (holder.fencing_token or 0)


def test_concurrent_runs_in_threads_never_overlap(redis_client: redis.Redis) -> None:
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(
        defs.hold_or_fail.enqueue("shared", 1.0))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ok = [r for r in results if r.status == "SUCCESSFUL"]
    assert len(results) == 4 and len(ok) >= 1
    assert all(failure(r).endswith("LockNotAcquired") for r in results if r not in ok)
    events = [r[0] for r in runs(redis_client)]
    assert events == ["start", "end"] * len(ok)  # one at a time


def test_a_lost_lease_raises_lock_lost_into_the_body(redis_client: redis.Redis) -> None:
    key = held_key(lock_name(defs.hold_or_fail, "lost"))
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(
        defs.hold_or_fail.enqueue("lost", 20)))
    started = time.monotonic()
    worker.start()
    deadline = time.monotonic() + 20
    while not redis_client.exists(key) and time.monotonic() < deadline:
        time.sleep(0.02)
    redis_client.delete(key)  # an operator (or an expiry) took the lease away
    worker.join(30)
    assert time.monotonic() - started < 15, "the body ran on after its lock was lost"
    assert failure(outcome[0]).endswith("LockLost")
    assert [r[0] for r in runs(redis_client)] == ["start", "lost"]


def test_current_lock_is_none_outside_a_locked_task() -> None:
    assert contrib_tasks.current_lock() is None
    assert issubclass(LockLost, Exception)


def test_over_the_rate_the_immediate_backend_raises_rate_limited(
        redis_client: redis.Redis) -> None:
    first = defs.limited.enqueue("u1")
    other = defs.limited.enqueue("u2")
    over = defs.limited.enqueue("u1")
    assert first.status == "SUCCESSFUL" and other.status == "SUCCESSFUL"
    assert failure(over).endswith("RateLimited")  # told, not dropped silently
    assert RateLimited.__name__ in failure(over)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "token_bucket"])
def test_every_rate_limit_algorithm_counts_per_argument_key(
        redis_client: redis.Redis, algorithm: str) -> None:
    def send(user: str, body: str = "") -> str:
        return user

    limited = contrib_tasks.rate_limited("2/m", key="user", algorithm=algorithm)(send)
    assert [limited("a", "x"), limited("a", body="y"), limited("b")] == ["a", "a", "b"]
    with pytest.raises(RateLimited) as caught:  # not a task: nothing to defer onto
        limited("a")
    assert caught.value.retry_after > 0 and caught.value.limit == 2


def test_enqueue_once_enqueues_once_per_key(redis_client: redis.Redis) -> None:
    first = contrib_tasks.enqueue_once(defs.plain, 21, idempotency_key="order-1")
    assert first.return_value == 42
    with pytest.raises(AlreadyEnqueued) as caught:
        contrib_tasks.enqueue_once(defs.plain, 21, idempotency_key="order-1")
    assert caught.value.task_id == first.id  # the immediate backend keeps no results
    with pytest.raises(IdempotencyKeyReused):
        contrib_tasks.enqueue_once(defs.plain, 22, idempotency_key="order-1")
    assert [r[2] for r in runs(redis_client)] == ["21"]
    for key in redis_client.scan_iter(match="*idem*"):
        assert redis_client.pttl(key) > 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="on_busy"):
        contrib_tasks.locked(on_busy="queue")
    with pytest.raises(ValueError, match="idempotency_key"):
        contrib_tasks.enqueue_once(defs.plain, 1, idempotency_key="")
    with pytest.raises(TypeError, match="does not take"):
        contrib_tasks.locked(key="nope")(lambda x: x).lock_name(1)
    assert LockNotAcquired.__mro__[1].__name__ == "LockError"


# --- the database backend and its worker processes ---------------------------------------------

pytest_db = pytest.mark.skipif(
    __import__("importlib").util.find_spec("django_tasks_db") is None,
    reason="django-tasks-db (the database backend; Django 5.2+) is not installed")


def _env(redis_url: str, db: Path) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": redis_url, "TASKS_DB": str(db), "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings_taskdb"}


def _django(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _enqueue(env: dict[str, str], code: str) -> str:
    script = ("import django; django.setup()\n"
              "from tests import django_tasks_defs as defs\n"
              "from django_redispatterns.contrib.tasks import enqueue_once\n" + code)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait_for(client: redis.Redis, check: Any, seconds: float = 60) -> list[list[str]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check(runs(client)):
            return runs(client)
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting; runs so far: {runs(client)}")


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest_db
def test_db_workers_reschedule_rate_limit_enqueue_once_and_survive_a_kill(
        redis_client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    env = _env(redis_url, tmp_path / "tasks.sqlite3")
    migrate = _django(env, "migrate", "--verbosity", "0")
    assert migrate.wait(120) == 0, migrate.stdout.read() if migrate.stdout else ""
    ids = _enqueue(env, (
        "a = defs.hold.enqueue('k', 30)\n"  # the run the kill interrupts
        "print(a.id)\n"
        "first = enqueue_once(defs.plain, 5, idempotency_key='job-5')\n"
        "again = enqueue_once(defs.plain, 5, idempotency_key='job-5')\n"
        "assert again.id == first.id, (again.id, first.id)\n"
        "for user in ('u', 'u', 'u'): defs.limited.enqueue(user)\n")).split()
    assert len(ids) == 1
    workers = [_django(env, "db_worker", "--interval", "0.2", "--no-startup-delay")
               for _ in range(2)]
    try:
        seen = _wait_for(redis_client, lambda r: any(e[:3] == ["start", "hold", "k"] for e in r))
        victim = next(w for w in workers if str(w.pid) in {e[4] for e in seen if e[0] == "start"})
        first_fence = int(next(e[3] for e in seen if e[:2] == ["start", "hold"]))
        # A second run of the same item while the first holds the lock: rescheduled, not lost.
        _enqueue(env, "defs.hold.enqueue('k', 0)\n")
        time.sleep(1.0)
        os.killpg(victim.pid, signal.SIGKILL)  # mid-task: no release, no clean-up
        killed_at = time.time()
        seen = _wait_for(redis_client, lambda r: any(e[:3] == ["end", "hold", "k"] for e in r)
                         and sum(e[:2] == ["ran", "limited"] for e in r) == 3
                         and any(e[:2] == ["ran", "plain"] for e in r))
    finally:
        _stop(workers)
    second = next(e for e in seen if e[:2] == ["end", "hold"])
    assert int(second[3]) > first_fence  # a fresh acquisition after the kill
    # Freed within the lease (1.5 s) plus the reschedule delay and worker polling, not a
    # long timeout; generous bound for a loaded machine.
    assert float(second[5]) - killed_at < 30
    assert [e[:3] for e in seen if e[1] == "plain"] == [["ran", "plain", "5"]]
    limited = [float(e[5]) for e in seen if e[:2] == ["ran", "limited"]]
    assert limited[-1] - limited[0] >= 1.9  # 1 run per 2 s window: the extra runs were deferred


def test_redis_down_fails_closed_and_enqueues_nothing(redis_client: redis.Redis) -> None:
    from django.conf import settings
    from django.test import override_settings

    from django_redispatterns import connection
    from django_redispatterns.exceptions import BackendUnavailable

    down = {**settings.REDIS_PATTERNS, "CONNECTION": "redis://127.0.0.1:1/0"}
    with override_settings(REDIS_PATTERNS=down):
        connection.reset_clients()
        try:
            result = defs.hold_or_fail.enqueue("down", 0)
            with pytest.raises(BackendUnavailable):
                contrib_tasks.enqueue_once(defs.plain, 1, idempotency_key="down-1")
            limited = defs.limited.enqueue("down")
        finally:
            connection.reset_clients()
    assert failure(result).endswith("BackendUnavailable")
    assert failure(limited).endswith("BackendUnavailable")
    assert runs(redis_client) == []  # no body ran, nothing was enqueued
