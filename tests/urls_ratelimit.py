"""URLconf for the rate-limit tests: decorated sync/async views, plain views, DRF."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redispatterns.contrib.drf import RedisRateThrottle
from django_redispatterns.exceptions import RateLimited
from django_redispatterns.ratelimit import ratelimit


def _state(request: HttpRequest) -> JsonResponse:
    decision = getattr(request, "ratelimit", None)
    return JsonResponse({
        "limited": getattr(request, "limited", False),
        "remaining": None if decision is None else decision.remaining,
    })


@ratelimit("3/m", key="ip", algorithm="sliding_window", methods=["POST"])
def login(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m")
def fixed(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("1/m", algorithm="token_bucket", burst=2)
def bucket(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", group="shared")
def grouped(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", key="user")
def per_user(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", key="header:X-Api-Key")
def per_header(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", key=lambda request: request.GET.get("tenant"))
def per_callable(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("1/m", block=False)
def soft(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("5/m", name="burst")
@ratelimit("2/m", name="sustained")
def stacked(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", algorithm="sliding_window")
async def async_view(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m")
async def async_fixed(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", key="user_or_ip")
async def async_user(request: HttpRequest) -> HttpResponse:
    return _state(request)


def plain(request: HttpRequest) -> HttpResponse:
    return _state(request)


def tier_rate(request: HttpRequest) -> str | None:
    """A per-tier rate: ?tier=free 2/m, ?tier=pro 4/m, ?tier=staff not limited."""
    return {"free": "2/m", "pro": "4/m", "staff": None}[request.GET.get("tier", "free")]


def legacy_tier_rate(group: str, request: HttpRequest) -> str:
    """django-ratelimit's signature: (group, request)."""
    assert group == "legacy-tier"
    return "3/m"


@ratelimit(tier_rate)
def tiered(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit(legacy_tier_rate, group="legacy-tier")
def legacy_tiered(request: HttpRequest) -> HttpResponse:
    return _state(request)


@ratelimit("2/m", shadow=True, name="trial")
def shadowed(request: HttpRequest) -> HttpResponse:
    return _reads_shadow(request)


@ratelimit("5/m", name="live")
@ratelimit("2/m", shadow=True, name="trial")
def shadow_and_live(request: HttpRequest) -> HttpResponse:
    return _reads_shadow(request)


def _reads_shadow(request: HttpRequest) -> JsonResponse:
    shadow = getattr(request, "ratelimit_shadow", [])
    return JsonResponse({"limited": request.limited,  # type: ignore[attr-defined]
                         "remaining": request.ratelimit.remaining,  # type: ignore[attr-defined]
                         "shadow": [d.allowed for d in shadow]})


@ratelimit("10/m", cost=3, name="export")
def costly(request: HttpRequest) -> HttpResponse:
    return _state(request)


def redirect(request: HttpRequest) -> HttpResponse:
    from django.shortcuts import redirect as to

    return to("/plain/")


def _reads(request: HttpRequest) -> JsonResponse:
    """A view that reads the attributes directly, as the docs invite (no getattr)."""
    decision = request.ratelimit  # type: ignore[attr-defined]
    return JsonResponse({"limited": request.limited,  # type: ignore[attr-defined]
                         "allowed": decision.allowed, "decided": decision.decided,
                         "remaining": decision.remaining})


@ratelimit("2/m")
def reads(request: HttpRequest) -> HttpResponse:
    return _reads(request)


@ratelimit("2/m")
async def async_reads(request: HttpRequest) -> HttpResponse:
    return _reads(request)


def plain_reads(request: HttpRequest) -> HttpResponse:
    return _reads(request)


async def async_plain_reads(request: HttpRequest) -> HttpResponse:
    return _reads(request)


async def async_plain(request: HttpRequest) -> HttpResponse:
    return _state(request)


def custom_429(request: HttpRequest, exception: RateLimited) -> HttpResponse:
    return HttpResponse(json.dumps({"custom": True, "retry": exception.retry_after > 0}),
                        status=429, content_type="application/json")


async def async_custom_429(request: HttpRequest, exception: RateLimited) -> HttpResponse:
    return HttpResponse("slow down (async)", status=429)


class ClassView(View):
    @ratelimit("2/m")  # directly on the method: the decorator finds the request
    def get(self, request: HttpRequest) -> HttpResponse:
        return _state(request)

    @method_decorator(ratelimit("1/m"))
    def post(self, request: HttpRequest) -> HttpResponse:
        return _state(request)


class Throttled(RedisRateThrottle):
    scope = "tests"
    key = "ip"


class ThrottledView(APIView):
    throttle_classes = [Throttled]
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class ShadowThrottle(RedisRateThrottle):
    scope = "tests"
    key = "ip"
    shadow = True


class TierThrottle(RedisRateThrottle):
    scope = "tiers"
    key = "ip"
    rate = staticmethod(tier_rate)


class ShadowThrottledView(ThrottledView):
    throttle_classes = [ShadowThrottle]


class TierThrottledView(ThrottledView):
    throttle_classes = [TierThrottle]


class ThrottledReadsView(ThrottledView):
    def get(self, request: Any) -> Response:
        return Response(json.loads(_reads(request).content))


urlpatterns = [
    path("login/", login),
    path("fixed/", fixed),
    path("bucket/", bucket),
    path("user/", per_user),
    path("header/", per_header),
    path("callable/", per_callable),
    path("soft/", soft),
    path("stacked/", stacked),
    path("async/", async_view),
    path("async-user/", async_user),
    path("async-fixed/", async_fixed),
    path("plain/", plain),
    path("api/plain/", plain),
    path("async-plain/", async_plain),
    path("drf/", ThrottledView.as_view()),
    path("drf-reads/", ThrottledReadsView.as_view()),
    path("reads/", reads),
    path("grouped/", grouped),
    path("tiered/", tiered),
    path("legacy-tiered/", legacy_tiered),
    path("shadowed/", shadowed),
    path("shadow-and-live/", shadow_and_live),
    path("costly/", costly),
    path("api/redirect/", redirect),
    path("drf-shadow/", ShadowThrottledView.as_view()),
    path("drf-tiers/", TierThrottledView.as_view()),
    path("async-reads/", async_reads),
    path("api/reads/", plain_reads),
    path("api/async-reads/", async_plain_reads),
    path("class/", ClassView.as_view()),
]
