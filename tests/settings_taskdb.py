"""tests.settings plus Django's tasks on the database backend (django-tasks-db) in an SQLite
file (``$TASKS_DB``), for the ``db_worker`` processes of tests/test_tasks.py."""

from __future__ import annotations

import os
from importlib.util import find_spec

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("TASKS_DB", "tasks.sqlite3"),
                         "OPTIONS": {"timeout": 30}}}
# The backport's app only where Django has no tasks framework of its own (before 6.0).
_BACKPORT = [] if find_spec("django.tasks") is not None else ["django_tasks"]
INSTALLED_APPS = [*INSTALLED_APPS, *_BACKPORT, "django_tasks_db"]
TASKS = {"default": {"BACKEND": "django_tasks_db.backend.DatabaseBackend"}}
