"""Django REST framework throttle backed by the same Redis limiter.

::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["django_redispatterns.contrib.drf.RedisRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"default": "100/min"},
    }

Unlike DRF's cache throttles (GET + SET from Python: 29 of 100 concurrent requests pass at
10/min), each decision is one atomic script. Rates come from DRF's
``DEFAULT_THROTTLE_RATES[scope]`` (or a ``rate`` class attribute). Subclass to change
``scope``, ``key`` (``"user_or_ip"`` by default; any rate-limit key) or ``algorithm``
(``"sliding_window"`` by default, DRF's own semantics made exact). When Redis cannot
answer, ``RATELIMIT['FAIL_OPEN']`` decides: allow (logged) or a 503.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from ..conf import get_config
from ..exceptions import BackendUnavailable
from ..ratelimit.algorithms import Decision
from ..ratelimit.engine import logger
from ..ratelimit.identity import resolve_key
from ..ratelimit.limiter import RateLimiter
from ..signals import ratelimit_blocked


class RateLimitUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Rate limiting is temporarily unavailable."
    default_code = "ratelimit_unavailable"


class RedisRateThrottle(BaseThrottle):
    """A DRF throttle deciding each request with one atomic Redis script."""

    scope: str = "default"
    rate: str | None = None
    key: Any = "user_or_ip"
    algorithm: str = "sliding_window"
    burst: int | None = None

    def __init__(self) -> None:
        rate = self.rate or self.get_rate()
        self.limiter = RateLimiter(rate, algorithm=self.algorithm, burst=self.burst,
                                   group=f"drf:{self.scope}", name=self.scope)
        self.identity = resolve_key(self.key)
        self.decision: Decision | None = None

    def get_rate(self) -> str:
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        try:
            rate = rates[self.scope]
        except KeyError:
            raise ImproperlyConfigured(
                f"No throttle rate for scope {self.scope!r} in "
                "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']."
            ) from None
        if not rate:
            raise ImproperlyConfigured(f"Throttle rate for scope {self.scope!r} is empty.")
        return str(rate)

    def allow_request(self, request: Any, view: Any) -> bool:
        identity = self.identity(request)
        if identity is None:
            return True
        try:
            decision = self.limiter.hit(identity)
        except BackendUnavailable as exc:
            fail_open = get_config().feature("RATELIMIT")["FAIL_OPEN"]
            logger.warning("DRF throttle %r: backend unavailable (%s); %s", self.scope, exc,
                           "allowing (FAIL_OPEN)" if fail_open else "answering 503")
            if fail_open:
                return True
            raise RateLimitUnavailable() from exc
        self.decision = decision
        # Let RateLimitMiddleware (if installed) put the headers on the response.
        django_request = getattr(request, "_request", request)
        previous = getattr(django_request, "_ratelimit_decisions", [])
        django_request._ratelimit_decisions = [*previous, decision]
        if not decision.allowed:
            digest = self.limiter.digest(identity)
            logger.info("DRF throttle %r blocked %s %s, identity %s", self.scope,
                        request.method, request.path, digest)
            ratelimit_blocked.send(sender=type(self), request=django_request,
                                   rule=f"drf:{self.scope}", decision=decision,
                                   identity=digest)
        return decision.allowed

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return self.decision.retry_after
