"""URLconf for the fault suite: one view per feature, each answering by that feature's policy.

``RUNS`` counts executions of the idempotent view and of the cache's compute function in
this process (the Redis under test may be dead, so the count cannot live there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_redispatterns.exceptions import BackendUnavailable, LockNotAcquired
from django_redispatterns.idempotency import idempotent
from django_redispatterns.locks import Lock
from django_redispatterns.ratelimit import ratelimit

RUNS: Counter[str] = Counter()
# Called in the middle of each feature's operation (a fault test kills Redis there).
HOOKS: dict[str, Callable[[], None]] = {}


def _hook(name: str) -> None:
    hook = HOOKS.pop(name, None)
    if hook is not None:
        hook()


@ratelimit("100000/m", key="ip", algorithm="fixed_window")
def limited(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


def counter(request: HttpRequest) -> HttpResponse:
    """Counts this session's visits (one session save per request)."""
    request.session["n"] = int(request.session.get("n", 0)) + 1
    _hook("sess")
    return JsonResponse({"n": request.session["n"]})


def _tester(request: HttpRequest) -> str:
    return "tester"


@csrf_exempt
@idempotent(scope=_tester)
def charge(request: HttpRequest) -> HttpResponse:
    RUNS["charge"] += 1
    _hook("charge")
    return JsonResponse({"charge": RUNS["charge"]}, status=201)


def cached(request: HttpRequest) -> HttpResponse:
    def compute() -> Any:
        RUNS["compute"] += 1
        _hook("compute")
        return {"report": RUNS["compute"]}

    return JsonResponse(caches["patterns"].get_or_set("faults:report", compute, 60))


@csrf_exempt
def job(request: HttpRequest) -> HttpResponse:
    try:
        with Lock("faults-job", ttl=5):
            RUNS["job"] += 1
            _hook("job")
            return JsonResponse({"ran": True})
    except LockNotAcquired:
        return JsonResponse({"ran": False}, status=409)
    except BackendUnavailable:  # locks fail closed (acquire), or the release failed
        return JsonResponse({"ran": False}, status=503)


urlpatterns = [
    path("rl/", limited),
    path("sess/", counter),
    path("charge/", charge),
    path("cache/", cached),
    path("job/", job),
]
