"""The responses the rate limiter answers with: 429 when blocked, 503 when Redis cannot
decide and ``FAIL_OPEN`` is False.

Clients that accept JSON (or send no ``Accept``/``*/*``: API clients) get an RFC 9457
problem document; browsers (``Accept: text/html``) a short text body.
``RATELIMIT['VIEW']`` swaps the 429 for a project's own view (sync or async).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from ..conf import get_config
from ..exceptions import ConfigurationError, RateLimited
from ..problems import PROBLEM_JSON, problem_response
from .algorithms import Decision, whole_seconds
from .headers import add_headers
from .identity import trusted_networks

PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def _wants_json(request: HttpRequest) -> bool:
    accept = request.META.get("HTTP_ACCEPT", "")
    if "json" in accept:
        return True
    return "text/html" not in accept  # API clients (no Accept, */*) get JSON


def error_response(request: HttpRequest, status: int, code: str, detail: str,
                   **extra: Any) -> HttpResponse:
    if _wants_json(request):
        accept = request.META.get("HTTP_ACCEPT", "")
        content_type = (PROBLEM_JSON if "problem+json" in accept or "json" not in accept
                        else "application/json")
        return problem_response(
            status, code, detail, content_type=content_type,
            problem_type=PROBLEM_TYPE if status == 429 else "about:blank", **extra,
        )
    return HttpResponse(f"{HTTPStatus(status).phrase}: {detail}\n", status=status,
                        content_type="text/plain; charset=utf-8")


def unavailable_response(request: HttpRequest) -> HttpResponse:
    """503 + ``Retry-After: 1``: Redis cannot decide and the policy is to fail closed."""
    response = error_response(request, 503, "ratelimit_unavailable",
                              "Rate limiting is temporarily unavailable.")
    response["Retry-After"] = "1"
    return response


def custom_view() -> Callable[..., Any] | None:
    path = get_config().feature("RATELIMIT")["VIEW"]
    if not path:
        return None
    try:
        return import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"REDIS_PATTERNS['RATELIMIT']['VIEW'] {path!r} cannot be imported: {exc}"
        ) from exc


def validate_section(section: Any) -> None:
    """Fail at startup on unusable TRUSTED_PROXIES, IPV6_PREFIX or VIEW, naming the value."""
    trusted_networks(tuple(section["TRUSTED_PROXIES"]))
    prefix = section["IPV6_PREFIX"]
    if not 1 <= prefix <= 128:
        raise ConfigurationError(
            f"REDIS_PATTERNS['RATELIMIT']['IPV6_PREFIX'] must be 1..128, got {prefix!r}."
        )
    custom_view()


def blocked_response(request: HttpRequest, blocked: list[Decision]) -> Any:
    """The 429 (or the custom view's answer; an awaitable if that view is async)."""
    decision = max(blocked, key=lambda d: d.retry_after)
    retry = max(whole_seconds(decision.retry_after), 1)
    view = custom_view()
    if view is not None:
        exc = RateLimited(retry_after=decision.retry_after, limit=decision.limit,
                          remaining=decision.remaining or 0)
        result = view(request, exc)
        if inspect.isawaitable(result):
            return _finish_async(request, result, retry)
        return _finish(request, result, retry)
    response = error_response(
        request, 429, "rate_limited",
        f"Rate limit exceeded; retry in {retry} second{'s' if retry != 1 else ''}.",
        retry_after=retry, **{"violated-policies": [d.name for d in blocked]},
    )
    return _finish(request, response, retry)


async def _finish_async(request: HttpRequest, result: Any, retry: int) -> HttpResponse:
    return _finish(request, await result, retry)


def _finish(request: HttpRequest, response: HttpResponse, retry: int) -> HttpResponse:
    if not response.has_header("Retry-After"):
        response["Retry-After"] = str(retry)
    add_headers(request, response)
    return response
