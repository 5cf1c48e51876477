"""The request-side engine shared by the decorator and the middleware.

:class:`Rule` = a limiter plus how to find the identity and which requests it covers.
:func:`check` / :func:`acheck` decide every applicable rule of a request in one round trip,
record the decisions on the request (``request.ratelimit``), log and signal every block,
apply the ``FAIL_OPEN`` policy when Redis cannot answer, and return the response to send
instead of the view's (429 / 503), or ``None`` to let the request through.
:func:`add_headers` puts the rate-limit headers on any response.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from ..conf import get_config
from ..exceptions import BackendUnavailable, ConfigurationError, RateLimited
from ..problems import PROBLEM_JSON, problem_response
from ..signals import ratelimit_blocked
from .algorithms import Decision, whole_seconds
from .identity import KeyFunc, resolve_key, trusted_networks
from .limiter import RateLimiter, ahit_many, hit_many
from .rates import DEFAULT_ALGORITHM, validate_methods

logger = logging.getLogger("django_redispatterns.ratelimit")

PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"
_DECISIONS_ATTR = "_ratelimit_decisions"


@dataclass(frozen=True)
class Rule:
    """One limit applied to requests: ``limiter`` counts, ``key`` says who is counted."""

    limiter: RateLimiter
    key: KeyFunc
    methods: frozenset[str] | None = None
    path: re.Pattern[str] | None = None
    cost: int = 1
    block: bool = True
    label: str = ""

    @classmethod
    def build(
        cls, *, rate: str, key: str | Callable[[Any], Any] = "ip",
        algorithm: str = DEFAULT_ALGORITHM, methods: Any = None, burst: int | None = None,
        group: str, name: str | None = None, path: str | None = None, cost: int = 1,
        block: bool = True,
    ) -> Rule:
        limiter = RateLimiter(rate, algorithm=algorithm, burst=burst, group=group, name=name)
        return cls(
            limiter=limiter, key=resolve_key(key), methods=validate_methods(methods),
            path=re.compile(path) if path else None, cost=cost, block=block,
            label=f"{group} {limiter.rate} {algorithm}",
        )

    def applies(self, request: HttpRequest) -> bool:
        if self.methods is not None and request.method not in self.methods:
            return False
        return self.path is None or self.path.search(request.path_info) is not None


# --- deciding ---------------------------------------------------------------------------


def _pending(request: HttpRequest, rules: Sequence[Rule]) -> list[tuple[Rule, str]]:
    out = []
    for rule in rules:
        if rule.applies(request):
            identity = rule.key(request)
            if identity is not None:
                out.append((rule, identity))
    return out


def check(request: HttpRequest, rules: Sequence[Rule]) -> HttpResponse | None:
    """Decide ``rules`` for ``request``; the response to send instead, or ``None``."""
    pending = _pending(request, rules)
    if not pending:
        return None
    try:
        if len(pending) == 1:
            rule, identity = pending[0]
            decisions = [rule.limiter.hit(identity, rule.cost)]
        else:
            decisions = hit_many([(r.limiter, ident, r.cost, None) for r, ident in pending])
    except BackendUnavailable as exc:
        return _unavailable(request, exc)
    blocked = _record(request, pending, decisions)
    if not blocked:
        return None
    response = _blocked_response(request, blocked)
    if inspect.isawaitable(response):
        response = async_to_sync(_await)(response)
    return response


def _evaluate_user(request: HttpRequest) -> None:
    request.user.is_authenticated  # noqa: B018 - forces the lazy object's DB lookup


async def acheck(request: HttpRequest, rules: Sequence[Rule]) -> HttpResponse | None:
    """Async twin of :func:`check` (redis.asyncio, no thread hop)."""
    if any(getattr(r.key, "needs_user", False) for r in rules):
        # Resolve the lazy user without a sync DB call inside the event loop.
        if hasattr(request, "auser"):
            request.user = await request.auser()
        elif hasattr(request, "user"):  # Django 4.2: no auser(); evaluate it in a thread
            await sync_to_async(_evaluate_user)(request)
    pending = _pending(request, rules)
    if not pending:
        return None
    try:
        if len(pending) == 1:
            rule, identity = pending[0]
            decisions = [await rule.limiter.ahit(identity, rule.cost)]
        else:
            decisions = await ahit_many(
                [(r.limiter, ident, r.cost, None) for r, ident in pending])
    except BackendUnavailable as exc:
        return _unavailable(request, exc)
    blocked = _record(request, pending, decisions)
    if not blocked:
        return None
    view = _custom_view()
    if view is None or inspect.iscoroutinefunction(view):
        response = _blocked_response(request, blocked)  # no thread hop
    else:
        response = await sync_to_async(_blocked_response)(request, blocked)
    if inspect.isawaitable(response):
        response = await response
    return response


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _record(request: HttpRequest, pending: list[tuple[Rule, str]],
            decisions: list[Decision]) -> list[Decision]:
    seen: list[Decision] = getattr(request, _DECISIONS_ATTR, [])
    seen = seen + decisions
    setattr(request, _DECISIONS_ATTR, seen)
    request.ratelimit = binding(seen)  # type: ignore[attr-defined]
    blocking = []
    for (rule, identity), decision in zip(pending, decisions, strict=True):
        if decision.allowed:
            continue
        digest = rule.limiter.digest(identity)
        logger.info(
            "rate limit blocked %s %s: rule %s, identity %s, retry after %.1fs",
            request.method, request.path, rule.label, digest, decision.retry_after,
        )
        ratelimit_blocked.send(sender=RateLimiter, request=request, rule=rule.label,
                               decision=decision, identity=digest)
        if rule.block:
            blocking.append(decision)
    if any(not d.allowed for d in decisions):
        request.limited = True  # type: ignore[attr-defined]  # django-ratelimit's name
    return blocking


def binding(decisions: Sequence[Decision]) -> Decision:
    """The decision the headers describe: the blocking one that lasts longest, else the
    one with the least room left."""
    blocked = [d for d in decisions if not d.allowed]
    if blocked:
        return max(blocked, key=lambda d: d.retry_after)
    return min(decisions, key=lambda d: (d.remaining, -d.reset_after))


def _unavailable(request: HttpRequest, exc: BackendUnavailable) -> HttpResponse | None:
    fail_open = get_config().feature("RATELIMIT")["FAIL_OPEN"]
    logger.warning(
        "rate limit backend unavailable (%s) for %s %s; %s", exc, request.method, request.path,
        "letting the request through (FAIL_OPEN)" if fail_open else "answering 503",
    )
    if fail_open:
        return None
    response = _error_response(request, 503, "ratelimit_unavailable",
                               "Rate limiting is temporarily unavailable.")
    response["Retry-After"] = "1"
    return response


# --- responses --------------------------------------------------------------------------


def _wants_json(request: HttpRequest) -> bool:
    accept = request.META.get("HTTP_ACCEPT", "")
    if "json" in accept:
        return True
    return "text/html" not in accept  # API clients (no Accept, */*) get JSON


def _error_response(request: HttpRequest, status: int, code: str, detail: str,
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


def _custom_view() -> Callable[..., Any] | None:
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
    _custom_view()


def _blocked_response(request: HttpRequest, blocked: list[Decision]) -> Any:
    decision = max(blocked, key=lambda d: d.retry_after)
    retry = max(whole_seconds(decision.retry_after), 1)
    view = _custom_view()
    if view is not None:
        exc = RateLimited(retry_after=decision.retry_after, limit=decision.limit,
                          remaining=decision.remaining)
        result = view(request, exc)
        if inspect.isawaitable(result):
            return _finish_async(request, result, retry)
        return _finish(request, result, retry)
    response = _error_response(
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


# --- headers ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _policy_name(name: str) -> str:
    return "".join(c for c in name if 0x20 <= ord(c) < 0x7F and c not in '"\\') or "default"


def add_headers(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Put the rate-limit headers of every decision made for ``request`` on ``response``.

    ``RateLimit-Limit/-Remaining/-Reset`` describe the binding decision; the IETF draft's
    ``RateLimit-Policy`` and ``RateLimit`` list every policy applied.
    """
    decisions: list[Decision] = getattr(request, _DECISIONS_ATTR, None) or []
    if not decisions:
        return response
    top = binding(decisions)
    response["RateLimit-Limit"] = str(top.limit)
    response["RateLimit-Remaining"] = str(top.remaining)
    response["RateLimit-Reset"] = str(whole_seconds(top.reset_after))
    policies, states, used = [], [], set()
    for decision in decisions:
        name = base = _policy_name(decision.name)
        n = 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        rate = decision.policy
        quota, window = (rate.limit, rate.period) if rate else (decision.limit, 0)
        policies.append(f'"{name}";q={quota};w={window}')
        states.append(f'"{name}";r={decision.remaining};t={whole_seconds(decision.reset_after)}')
    response["RateLimit-Policy"] = ", ".join(policies)
    response["RateLimit"] = ", ".join(states)
    return response
