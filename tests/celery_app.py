"""A Celery app for tests/test_tasks_celery.py: ``celery -A tests.celery_app worker``.

The broker and result backend are ``$CELERY_BROKER_URL`` (a private redis-server the test
starts: the broker's queues have no TTL, so they stay off the main test Redis); locks and
rate limits use the app's own connection (``$REDIS_URL``) like any other feature.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery  # noqa: E402

from django_redispatterns.contrib.celery import (  # noqa: E402
    current_lock,
    locked,
    rate_limited,
)
from tests.task_defs import hold_body, log  # noqa: E402

BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
app = Celery("django_redispatterns_tests", broker=BROKER, backend=BROKER)
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_default_retry_delay=0.5, result_expires=600,
                broker_transport_options={"visibility_timeout": 600})


def _fence() -> int | None:
    lock = current_lock()
    return lock.fencing_token if lock is not None else None


@app.task(bind=True, name="tests.hold")
@locked(key="item", ttl=1.5, on_busy="reschedule", countdown=0.5)
def hold(self: object, item: str, seconds: float) -> int | None:
    return hold_body("hold", item, seconds, _fence())


@app.task(name="tests.limited")
@rate_limited("1/2s", key="user")
def limited(user: str) -> str:
    log("ran", "limited", user)
    return user


@app.task(name="tests.plain")
def plain(x: int) -> int:
    log("ran", "plain", str(x))
    return x * 2
