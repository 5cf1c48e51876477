"""Rate-limit demo: hit three limited endpoints (one per algorithm) and watch the headers.

Each endpoint allows 5 requests per 10 seconds per client IP. The page calls them from the
browser — one at a time or 10 at once — and shows the status and every rate-limit header
as it arrives; "reset" unblocks you (what ``manage.py ratelimit reset`` does).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.ratelimit import RateLimiter, ratelimit
from django_redispatterns.ratelimit.identity import by_ip

RATE = "5/10s"
ALGORITHMS = ("fixed_window", "sliding_window", "token_bucket")


def _answer(request: HttpRequest) -> JsonResponse:
    # Always set once the rule ran; decided is False when Redis could not answer and the
    # request was let through (FAIL_OPEN): then there are no counts to show.
    decision = request.ratelimit  # type: ignore[attr-defined]
    return JsonResponse({"allowed": decision.allowed, "decided": decision.decided,
                         "remaining": decision.remaining,
                         "reset_after": decision.reset_after})


@ratelimit(RATE, key="ip", algorithm="fixed_window", group="demo-fixed_window")
def fixed_window(request: HttpRequest) -> HttpResponse:
    return _answer(request)


@ratelimit(RATE, key="ip", algorithm="sliding_window", group="demo-sliding_window")
def sliding_window(request: HttpRequest) -> HttpResponse:
    return _answer(request)


@ratelimit(RATE, key="ip", algorithm="token_bucket", burst=5, group="demo-token_bucket")
async def token_bucket(request: HttpRequest) -> HttpResponse:  # an async view, same decorator
    return _answer(request)


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/ratelimit.html", {"rate": RATE, "algorithms": ALGORITHMS})


@require_POST
def reset(request: HttpRequest) -> HttpResponse:
    identity = by_ip(request)
    try:
        cleared = [algorithm for algorithm in ALGORITHMS
                   if RateLimiter(RATE, algorithm=algorithm,
                                  group=f"demo-{algorithm}").reset(identity)]
    except BackendUnavailable:
        return JsonResponse({"error": "Redis is unavailable; nothing to reset."}, status=503)
    return JsonResponse({"cleared": cleared})


urlpatterns = [
    path("", index, name="index"),
    path("fixed_window/", fixed_window, name="fixed_window"),
    path("sliding_window/", sliding_window, name="sliding_window"),
    path("token_bucket/", token_bucket, name="token_bucket"),
    path("reset/", reset, name="reset"),
]
