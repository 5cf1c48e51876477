"""The soak's views: each feature used the way its docs page shows it.

Under WSGI the views are sync; under ASGI (``SOAK_ASYNC_VIEWS=1``) the same views are
``async def`` (native async rate limits, ``aget_or_set``, async idempotency). Side effects
(a computed cache value, an order) are appended to a run log outside Redis, so the checks
can count how often each really ran, whatever Redis forgot.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import aauthenticate, alogin, authenticate, login
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, JsonResponse

from soak import config

_log_lock = threading.Lock()
_log_file: Any = None


def run_log(record: dict[str, Any]) -> None:
    """Append one line to this process's run log (one write() per line)."""
    global _log_file
    if not settings.RUNLOG:
        return
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with _log_lock:
        if _log_file is None:
            path = os.path.join(settings.RUNLOG, f"runlog-{os.getpid()}.jsonl")
            _log_file = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the process
        _log_file.write(line)


def start_stall_watch(period: float = 0.02, stall: float = 0.25) -> None:
    """A thread in each worker that notes when the OS did not run this process for a while
    (a starved machine): requests then time out although nothing was injected, and the
    checks must know. A thread sees it even while the event loop is busy."""
    if not settings.RUNLOG:
        return

    def watch() -> None:
        while True:
            before = time.time()
            time.sleep(period)
            after = time.time()
            if after - before - period > stall:
                run_log({"kind": "stall", "start": before, "end": after, "pid": os.getpid()})

    threading.Thread(target=watch, name="soak-stall-watch", daemon=True).start()


# --- rate limits --------------------------------------------------------------------------

def ok(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


async def aok(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


def ratelimited(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """django-ratelimit's RATELIMIT_VIEW for the comparison stack: a plain 429."""
    return JsonResponse({"detail": "rate limited"}, status=429)


def limited_view(name: str, view: Callable[..., Any]) -> Callable[..., Any]:
    """``view`` behind the rate limit of route ``name`` (``config.rate_routes()``)."""
    _path, rate, algorithm, burst = config.rate_routes()[name]
    if settings.STACK == "ours":
        if name == "api_rule":
            return view  # RateLimitMiddleware's rule covers /api/
        from django_redispatterns.ratelimit import ratelimit

        return ratelimit(rate=rate, key=f"header:{config.BUCKET_HEADER}", algorithm=algorithm,
                         burst=burst)(view)
    from django_ratelimit.decorators import ratelimit as dr_ratelimit

    header = config.BUCKET_HEADER.lower()
    return dr_ratelimit(key=f"header:{header}", rate=rate, block=True, group=name)(view)


# --- cache ----------------------------------------------------------------------------------

def _compute_starts(alias: str, key: str) -> float:
    """Logged so the fault injector can hang Redis while a computation is in flight."""
    started = time.time()
    run_log({"kind": "compute-start", "alias": alias, "key": key, "start": started})
    return started


def _computed(alias: str, key: str, started: float) -> dict[str, Any]:
    ended = time.time()
    run = uuid.uuid4().hex[:12]
    run_log({"kind": "compute", "alias": alias, "key": key, "start": started, "end": ended,
             "run": run, "pid": os.getpid()})
    return {"key": key, "computed_at": ended, "run": run}


def cached(request: HttpRequest, alias: str, n: int) -> JsonResponse:
    key = f"item:{n}"

    def compute() -> dict[str, Any]:
        started = _compute_starts(alias, key)
        time.sleep(config.COMPUTE_SECONDS)
        return _computed(alias, key, started)

    value = caches[alias].get_or_set(key, compute, timeout=config.CACHE_TIMEOUT)
    return JsonResponse(value)


async def acached(request: HttpRequest, alias: str, n: int) -> JsonResponse:
    key = f"item:{n}"

    async def compute() -> dict[str, Any]:
        started = _compute_starts(alias, key)
        await asyncio.sleep(config.COMPUTE_SECONDS)
        return _computed(alias, key, started)

    value = await caches[alias].aget_or_set(key, compute, timeout=config.CACHE_TIMEOUT)
    return JsonResponse(value)


# --- sessions -------------------------------------------------------------------------------

def _anonymous() -> JsonResponse:
    return JsonResponse({"user": None}, status=401)


def me(request: HttpRequest) -> JsonResponse:
    if not request.user.is_authenticated:
        return _anonymous()
    return JsonResponse({"user": request.user.pk})


async def ame(request: HttpRequest) -> JsonResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return _anonymous()
    return JsonResponse({"user": user.pk})


def signin(request: HttpRequest) -> JsonResponse:
    user = authenticate(request, username=request.POST.get("username"),
                        password=request.POST.get("password"))
    if user is None:
        return JsonResponse({"user": None}, status=403)
    login(request, user)
    return JsonResponse({"user": user.pk})


async def asignin(request: HttpRequest) -> JsonResponse:
    user = await aauthenticate(request, username=request.POST.get("username"),
                               password=request.POST.get("password"))
    if user is None:
        return JsonResponse({"user": None}, status=403)
    await alogin(request, user)
    return JsonResponse({"user": user.pk})


def _unavailable() -> JsonResponse:
    # logout_everywhere raises BackendUnavailable when Redis is down: the caller decides.
    response = JsonResponse({"detail": "session store unavailable"}, status=503)
    response["Retry-After"] = "5"
    return response


def logout_everywhere_view(request: HttpRequest) -> JsonResponse:
    """The documented one-liner: end every other session of this user."""
    if not request.user.is_authenticated:
        return _anonymous()
    from django_redispatterns.exceptions import BackendUnavailable
    from django_redispatterns.sessions import logout_everywhere

    try:
        deleted = logout_everywhere(request.user, keep=request.session.session_key)
    except BackendUnavailable:
        return _unavailable()
    return JsonResponse({"deleted": deleted})


async def alogout_everywhere_view(request: HttpRequest) -> JsonResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return _anonymous()
    from django_redispatterns.exceptions import BackendUnavailable
    from django_redispatterns.sessions import logout_everywhere

    try:
        deleted = await sync_to_async(logout_everywhere)(user, keep=request.session.session_key)
    except BackendUnavailable:
        return _unavailable()
    return JsonResponse({"deleted": deleted})


# --- idempotency ----------------------------------------------------------------------------

def _order(request: HttpRequest, user_id: Any) -> JsonResponse:
    """Place an order (the side effect is the run-log line) and answer 201."""
    key = request.headers.get("Idempotency-Key", "")
    run = uuid.uuid4().hex
    at = time.time()
    run_log({"kind": "order", "key": key, "user": user_id, "run": run, "t": at,
             "pid": os.getpid()})
    response = JsonResponse({"order": run, "key": key, "at": at,
                             "body": json.loads(request.body or b"{}")}, status=201)
    response["Location"] = f"/orders/{run}"
    return response


def orders(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return JsonResponse({"detail": "POST only"}, status=405)
    return _order(request, request.user.pk)


async def aorders(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return JsonResponse({"detail": "POST only"}, status=405)
    user = await request.auser()
    return _order(request, user.pk)
