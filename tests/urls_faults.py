"""URLconf for the fault suite: one rate-limited view, one session view, one idempotent view."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_redispatterns.ratelimit import ratelimit


@ratelimit("100000/m", key="ip", algorithm="fixed_window")
def limited(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


def counter(request: HttpRequest) -> HttpResponse:
    """Counts this session's visits (one session save per request)."""
    request.session["n"] = int(request.session.get("n", 0)) + 1
    return JsonResponse({"n": request.session["n"]})


urlpatterns = [
    path("rl/", limited),
    path("sess/", counter),
]
