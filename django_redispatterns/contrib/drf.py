"""Django REST framework throttle backed by the same Redis limiter.

::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["django_redispatterns.contrib.drf.RedisRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"default": "100/min"},
    }

Unlike DRF's cache throttles (GET + SET from Python: 29 of 100 concurrent requests pass at
10/min), each decision is one atomic script. Rates come from DRF's
``DEFAULT_THROTTLE_RATES[scope]`` (or a ``rate`` class attribute: a rate string, the dotted
path of a ``request -> rate or None`` callable, or ``staticmethod(callable)``). Subclass to
change ``scope``, ``key`` (``"user_or_ip"`` by default; any rate-limit key), ``algorithm``
(``"sliding_window"`` by default, DRF's own semantics made exact), ``cost`` or ``shadow``
(count, log and signal what would be throttled, never throttle). The view sees
``request.ratelimit`` and ``request.limited`` like any limited view. When Redis cannot
answer, ``RATELIMIT['FAIL_OPEN']`` decides: allow (logged, an undecided decision) or a 503
with ``Retry-After: 1``.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from ..ratelimit.algorithms import Decision
from ..ratelimit.engine import decide
from ..ratelimit.limiter import RateLimiter
from ..ratelimit.rules import RateSource, Rule


class RateLimitUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Rate limiting is temporarily unavailable."
    default_code = "ratelimit_unavailable"
    wait = 1  # DRF's exception handler turns it into Retry-After: 1


_rules: dict[tuple[type, Any], Rule] = {}
_rules_lock = threading.Lock()


class RedisRateThrottle(BaseThrottle):
    """A DRF throttle deciding each request with one atomic Redis script."""

    scope: str = "default"
    rate: RateSource | None = None
    key: Any = "user_or_ip"
    algorithm: str = "sliding_window"
    burst: int | None = None
    cost: int = 1
    shadow: bool = False

    def __init__(self) -> None:
        self.rule = self._rule()
        self.limiter: RateLimiter | None = self.rule.limiter
        self.decision: Decision | None = None

    def _rule(self) -> Rule:
        # DRF builds a throttle per request: the rule (and its limiters) once per class.
        source = inspect.getattr_static(type(self), "rate", None)
        if isinstance(source, staticmethod):
            source = source.__func__
        if source is None:
            source = self.get_rate()
        cache_key = (type(self), source)
        rule = _rules.get(cache_key)
        if rule is None:
            rule = Rule(rate=source, key=self.key, algorithm=self.algorithm, burst=self.burst,
                        group=f"drf:{self.scope}", name=self.scope, cost=self.cost,
                        shadow=self.shadow)
            with _rules_lock:
                _rules[cache_key] = rule
        return rule

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
        # Identity from the DRF request (its authenticated user); the decisions are recorded
        # on the Django request, where RateLimitMiddleware (if installed) adds the headers.
        django_request = getattr(request, "_request", request)
        outcome = decide(request, (self.rule,), target=django_request)
        if isinstance(outcome, HttpResponse):
            raise RateLimitUnavailable()
        if outcome:
            self.decision = outcome[0]
            return False
        return True

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return self.decision.retry_after
