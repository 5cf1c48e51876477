"""URLconf for the fault matrix (tests/test_fault_matrix.py): one small view per HTTP entry
point, sync and async, each reporting what the feature told it.

``RUNS`` counts the protected views' executions in this process (the Redis under test may
be dead, so the count cannot live there).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redispatterns.contrib.drf import RedisRateThrottle
from django_redispatterns.idempotency import idempotent
from django_redispatterns.ratelimit import ratelimit

RUNS: Counter[str] = Counter()
RATE = "1000/m"


def scope(request: HttpRequest) -> str:
    """Idempotency keys all belong to one caller here."""
    return "matrix"


def _decision(request: Any) -> JsonResponse:
    decision = getattr(request, "ratelimit", None)
    return JsonResponse({
        "decided": None if decision is None else decision.decided,
        "remaining": None if decision is None else decision.remaining,
        "limited": getattr(request, "limited", None),
    })


def plain(request: HttpRequest) -> HttpResponse:
    return _decision(request)


async def aplain(request: HttpRequest) -> HttpResponse:
    return _decision(request)


@ratelimit(RATE, key="ip", algorithm="fixed_window", group="matrix-dec")
def limited(request: HttpRequest) -> HttpResponse:
    return _decision(request)


@ratelimit(RATE, key="ip", algorithm="fixed_window", group="matrix-adec")
async def alimited(request: HttpRequest) -> HttpResponse:
    return _decision(request)


@ratelimit(RATE, key="ip", algorithm="fixed_window", group="matrix-adec-closed")
async def alimited_closed(request: HttpRequest) -> HttpResponse:
    return _decision(request)


class Throttle(RedisRateThrottle):
    scope = "matrix"
    rate = RATE
    key = "ip"


class Throttled(APIView):
    throttle_classes = [Throttle]
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get(self, request: Any) -> Response:
        decision = request._request.ratelimit
        return Response({"decided": decision.decided, "remaining": decision.remaining})


@csrf_exempt
def charge(request: HttpRequest) -> HttpResponse:
    RUNS["charge"] += 1
    return JsonResponse({"run": RUNS["charge"]}, status=201)


@csrf_exempt
async def acharge(request: HttpRequest) -> HttpResponse:
    RUNS["acharge"] += 1
    return JsonResponse({"run": RUNS["acharge"]}, status=201)


@csrf_exempt
@idempotent(scope=scope)
def charge_decorated(request: HttpRequest) -> HttpResponse:
    RUNS["charge_decorated"] += 1
    return JsonResponse({"run": RUNS["charge_decorated"]}, status=201)


def visits(request: HttpRequest) -> HttpResponse:
    """Counts this session's visits: one load and one save per request."""
    request.session["n"] = int(request.session.get("n", 0)) + 1
    return JsonResponse({"n": request.session["n"]})


async def avisits(request: HttpRequest) -> HttpResponse:
    n = int(await request.session.aget("n", 0)) + 1
    await request.session.aset("n", n)
    return JsonResponse({"n": n})


urlpatterns = [
    path("rl-mw/", plain),
    path("rl-mw-async/", aplain),
    path("rl-dec/", limited),
    path("rl-dec-async/", alimited),
    path("rl-dec-async-closed/", alimited_closed),
    path("drf/", Throttled.as_view()),
    path("idem-mw/", charge),
    path("idem-mw-async/", acharge),
    path("idem-dec/", charge_decorated),
    path("sess/", visits),
    path("sess-async/", avisits),
]
