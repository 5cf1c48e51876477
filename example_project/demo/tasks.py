"""Background tasks of the demo (Django's tasks framework; the backport before Django 6.0).

``rebuild_statement`` runs one at a time per account (a second run is rescheduled), writes
with its fencing token, and is enqueued once per idempotency key by the tasks page;
``send_statement`` is rate-limited per account. The project runs the immediate backend
(tasks run inside the request); with a worker backend (django-tasks-db's ``db_worker``)
the same code defers instead of failing.
"""

from __future__ import annotations

from demo.models import FencedReport

from django_redispatterns.contrib.tasks import current_lock, locked, rate_limited
from django_redispatterns.locks import fenced_update

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]


@task()
@locked(key="account", ttl=30, on_busy="reschedule", countdown=10)
def rebuild_statement(account: str) -> int:
    """Rebuild one account's statement; returns the fencing token it wrote with."""
    lock = current_lock()
    assert lock is not None and lock.fencing_token is not None
    name = f"statement-{account}"
    FencedReport.objects.get_or_create(name=name, defaults={"fencing_token": 0})
    fenced_update(FencedReport.objects.filter(name=name), lock.fencing_token,
                  body=f"statement of {account}", written_by="rebuild_statement task")
    return lock.fencing_token


@task()
@rate_limited("2/m", key="account")
def send_statement(account: str) -> str:
    return f"statement sent to {account}"
