"""Locks, rate limits and enqueue-once for Celery tasks
(``pip install "django-redispatterns[celery]"``).

The decorators go *under* ``@app.task`` (bound or not)::

    from django_redispatterns.contrib.celery import current_lock, locked, rate_limited

    @app.task(bind=True)
    @locked(key="account_id", ttl=30, on_busy="reschedule", countdown=10)
    def rebuild_statement(self, account_id: int) -> None:
        write_statement(account_id, fence=current_lock().fencing_token)

    result = enqueue_once(send_statement, 42, idempotency_key=f"statement-{month}")
    result.id  # the same AsyncResult id for every call with this key

Unlike celery-once and celery-singleton, the lock is taken when the task *runs* (not when
it is sent), is a short lease renewed while the body runs (a killed worker's lock is free
``ttl`` seconds later, not after an hour-long timeout), carries a fencing token, and raises
:class:`LockLost` into the body when lost. ``"reschedule"`` and rate-limit deferrals are a
Celery retry with the same task id that does not count against ``max_retries``; called
directly (not in a worker), they raise :class:`LockNotAcquired` / :class:`RateLimited`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task, current_task  # type: ignore[import-untyped,unused-ignore]
from celery.exceptions import Retry  # type: ignore[import-untyped,unused-ignore]

from ..exceptions import AlreadyEnqueued, LockLost, LockNotAcquired, RateLimited
from . import _background
from ._background import DEFAULT_ONCE_TTL, current_lock

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


class CeleryTasks(_background.Framework):
    """Deferral for Celery: send the task again with a countdown, as a retry that keeps
    the retry count (so deferrals never exhaust ``max_retries``)."""

    name = "celery"

    def leading(self, args: tuple[Any, ...]) -> int:
        return 1 if args and isinstance(args[0], Task) else 0

    def defer(self, countdown: float, error: Exception, args: tuple[Any, ...],
              kwargs: dict[str, Any], func: Callable[..., Any]) -> Any:
        task = args[0] if args and isinstance(args[0], Task) else current_task
        request = getattr(task, "request", None)
        if request is None or request.called_directly or request.is_eager:
            raise error
        signature = task.signature_from_request(request, countdown=countdown,
                                                retries=request.retries)
        signature.apply_async()
        raise Retry(str(error), exc=error, when=countdown, sig=signature)


FRAMEWORK = CeleryTasks()


_decorators = _background.Decorators(FRAMEWORK)
locked = _decorators.locked
single_flight = _decorators.single_flight
rate_limited = _decorators.rate_limited


def enqueue_once(task: Any, *args: Any, idempotency_key: str, ttl: float = DEFAULT_ONCE_TTL,
                 **kwargs: Any) -> Any:
    """``task.delay(*args, **kwargs)`` at most once per ``idempotency_key`` for ``ttl``
    seconds; every call returns the first call's ``AsyncResult``."""
    return _background.enqueue_once(
        task.name, idempotency_key, args, kwargs,
        enqueue=lambda: task.apply_async(args, kwargs), result_id=lambda r: str(r.id),
        lookup=task.AsyncResult, ttl=ttl)
