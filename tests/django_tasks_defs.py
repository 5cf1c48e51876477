"""Django tasks (``django.tasks`` or its backport) for tests/test_tasks.py; importable only
where the framework is installed."""

from __future__ import annotations

from django_redispatterns.contrib.tasks import current_lock, locked, rate_limited, single_flight
from tests.task_defs import hold_body, log

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]


def _fence() -> int | None:
    lock = current_lock()
    return lock.fencing_token if lock is not None else None


@task()
@locked(key="item", ttl=1.5, on_busy="reschedule", countdown=0.5)
def hold(item: str, seconds: float) -> int | None:
    return hold_body("hold", item, seconds, _fence())


@task()
@locked(key="item", ttl=1.5)
def hold_or_fail(item: str, seconds: float) -> int | None:
    return hold_body("hold_or_fail", item, seconds, _fence())


@task()
@locked(key="item", ttl=1.5, wait=20)
def hold_waiting(item: str, seconds: float) -> int | None:
    return hold_body("hold_waiting", item, seconds, _fence())


@task()
@single_flight(key=lambda item, seconds: item, ttl=1.5)
def once_at_a_time(item: str, seconds: float) -> int | None:
    return hold_body("once_at_a_time", item, seconds, _fence())


@task()
@rate_limited("1/2s", key="user")
def limited(user: str) -> str:
    log("ran", "limited", user)
    return user


@task()
def plain(x: int) -> int:
    log("ran", "plain", str(x))
    return x * 2
