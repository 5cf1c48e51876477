"""Locks, rate limits and enqueue-once for Django's tasks framework (``django.tasks``).

Django 6.0+ has the framework built in; on Django 4.2-5.2 install the backport
(``pip install "django-redispatterns[tasks]"``). The decorators go *under* ``@task``::

    from django.tasks import task  # or: from django_tasks import task
    from django_redispatterns.contrib.tasks import current_lock, locked, rate_limited

    @task()
    @locked(key="account_id", ttl=30, on_busy="reschedule", countdown=10)
    def rebuild_statement(account_id: int) -> None:
        write_statement(account_id, fence=current_lock().fencing_token)

    @task()
    @rate_limited("10/m", key="account_id")
    def send_statement(account_id: int) -> None: ...

    result = enqueue_once(send_statement, 42, idempotency_key=f"statement-{month}")

Guarantees (docs/tasks.md has the failure modes):

* one run at a time per lock name (the task's path, plus a hash of the ``key`` arguments);
  a second run raises, is skipped, or is re-enqueued ``countdown`` seconds later
  (``on_busy``); with a backend that cannot defer (the immediate one) ``"reschedule"``
  raises :class:`LockNotAcquired` to the caller;
* the lease (``ttl``) is renewed while the body runs; when it is lost, :class:`LockLost`
  is raised into the body (at its next Python bytecode) and out of the run;
* a killed worker's lock is free at most ``ttl`` seconds later;
* over a ``@rate_limited`` rate the run is re-enqueued ``retry_after`` seconds later
  (never dropped); the rescheduled run is a new task result;
* ``enqueue_once`` enqueues once per idempotency key and returns the first result where the
  backend can look results up, else raises :class:`AlreadyEnqueued` carrying its id.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.utils import timezone
from django.utils.module_loading import import_string

from ..exceptions import AlreadyEnqueued, LockLost, LockNotAcquired, RateLimited
from . import _background
from ._background import DEFAULT_ONCE_TTL, current_lock

try:  # Django 6.0+
    from django.tasks import Task, TaskContext  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # the backport on older Django
    from django_tasks import TaskContext  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
    from django_tasks.base import Task  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]

logger = logging.getLogger("django_redispatterns.tasks")

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "AlreadyEnqueued",
    "LockLost",
    "LockNotAcquired",
    "RateLimited",
    "current_lock",
    "enqueue_once",
    "locked",
    "rate_limited",
    "single_flight",
]


class DjangoTasks(_background.Framework):
    """Deferral for Django's tasks: enqueue the same task again with ``run_after``."""

    name = "django.tasks"

    def leading(self, args: tuple[Any, ...]) -> int:
        return 1 if args and isinstance(args[0], TaskContext) else 0

    def defer(self, countdown: float, error: Exception, args: tuple[Any, ...],
              kwargs: dict[str, Any], func: Callable[..., Any]) -> Any:
        task = _running_task(args, func)
        if task is None or not task.get_backend().supports_defer:
            raise error
        when = timezone.now() + datetime.timedelta(seconds=countdown)
        result = task.using(run_after=when).enqueue(*args[self.leading(args):], **kwargs)
        logger.info("task %s deferred %.1fs (%s): new result %s", task.module_path,
                    countdown, error, result.id)
        return None


def _running_task(args: tuple[Any, ...], func: Callable[..., Any]) -> Any:
    if args and isinstance(args[0], TaskContext):
        return args[0].task_result.task
    try:
        found = import_string(_background.task_name(func))
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


FRAMEWORK = DjangoTasks()


_decorators = _background.Decorators(FRAMEWORK)
locked = _decorators.locked
single_flight = _decorators.single_flight
rate_limited = _decorators.rate_limited


def enqueue_once(task: Any, *args: Any, idempotency_key: str, ttl: float = DEFAULT_ONCE_TTL,
                 **kwargs: Any) -> Any:
    """``task.enqueue(*args, **kwargs)`` at most once per ``idempotency_key`` for ``ttl``
    seconds; a repeat returns the first call's ``TaskResult`` (or raises
    :class:`AlreadyEnqueued` with its id when the backend cannot look results up)."""

    def lookup(result_id: str) -> Any:
        if not task.get_backend().supports_get_result:
            raise AlreadyEnqueued(f"task {task.module_path} was already enqueued with this "
                                  f"key as {result_id}", task_id=result_id)
        return task.get_result(result_id)

    return _background.enqueue_once(
        task.module_path, idempotency_key, args, kwargs,
        enqueue=lambda: task.enqueue(*args, **kwargs), result_id=lambda r: str(r.id),
        lookup=lookup, ttl=ttl)
