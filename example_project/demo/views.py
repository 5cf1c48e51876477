"""The home page: one link per feature demo (demo/features/<slug>.py)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@dataclass(frozen=True)
class Feature:
    slug: str
    title: str
    blurb: str


_ALL = [
    Feature("cache", "Stampede-safe cache", "One recompute per expired key; serve stale."),
    Feature("ratelimit", "Rate limiting", "Fixed window, sliding window, GCRA; 429 headers."),
    Feature("idempotency", "Idempotency keys", "Replay a POST's first answer; 409 while it runs."),
    Feature("sessions", "Sessions", "Your devices, and log out everywhere."),
    Feature("locks", "Locks", "Fenced locks and @single_flight management commands."),
    Feature("tasks", "Background tasks", "@locked tasks, enqueue once, task rate limits."),
    Feature("checks", "Checks", "What `check --deploy` and `redis_audit` say about this Redis."),
]

# The tasks page needs Django's tasks framework (built in from Django 6.0, else the backport).
_TASKS = find_spec("django.tasks") is not None or find_spec("django_tasks") is not None
FEATURES = [f for f in _ALL if find_spec(f"demo.features.{f.slug}") is not None
            and (f.slug != "tasks" or _TASKS)]


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/home.html", {"features": FEATURES})
