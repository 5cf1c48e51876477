"""The request-side engine shared by the decorator, the middleware and the DRF throttle.

:func:`check` / :func:`acheck` decide every applicable rule of a request in one round trip,
record the decisions on the request, log and signal every block, apply the ``FAIL_OPEN``
policy when Redis cannot answer, and return the response to send instead of the view's
(429 / 503), or ``None`` to let the request through.

After any rule ran, ``request.ratelimit`` (the binding :class:`Decision`) and
``request.limited`` exist, also when Redis could not decide: the rule then leaves an
undecided decision (allowed, ``decided=False``, no counts). Shadow rules count, log and
signal what they would block, but never block: their decisions are kept apart in
``request.ratelimit_shadow`` and appear in no header.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.http import HttpRequest, HttpResponse

from ..conf import get_config
from ..exceptions import BackendUnavailable
from ..signals import ratelimit_blocked, ratelimit_decided, ratelimit_unavailable
from .algorithms import Decision
from .headers import DECISIONS_ATTR, add_headers, binding
from .limiter import RateLimiter, ahit_many, hit_many
from .responses import blocked_response, custom_view, unavailable_response, validate_section
from .rules import Rule

logger = logging.getLogger("django_redispatterns.ratelimit")

SHADOW_ATTR = "ratelimit_shadow"
Pending = tuple[Rule, RateLimiter, str]

__all__ = [
    "Rule",
    "acheck",
    "add_headers",
    "adecide",
    "binding",
    "check",
    "decide",
    "validate_section",
]


# --- deciding ---------------------------------------------------------------------------


def _pending(request: HttpRequest, rules: Sequence[Rule]) -> list[Pending]:
    out = []
    for rule in rules:
        if rule.applies(request):
            identity = rule.key(request)
            if identity is not None:
                limiter = rule.limiter_for(request)
                if limiter is not None:
                    out.append((rule, limiter, identity))
    return out


def decide(request: HttpRequest, rules: Sequence[Rule], *,
           target: Any = None) -> list[Decision] | HttpResponse:
    """Decide ``rules`` and record them on ``request`` (or ``target``: the Django request
    behind a DRF request): the blocking decisions (empty: let the request through), or
    the 503 to answer when Redis cannot decide and the policy is to fail closed."""
    target = request if target is None else target
    pending = _pending(request, rules)
    if not pending:
        return []
    try:
        if len(pending) == 1:
            rule, limiter, identity = pending[0]
            decisions = [limiter.hit(identity, rule.cost)]
        else:
            decisions = hit_many([(lim, ident, r.cost, None) for r, lim, ident in pending])
    except BackendUnavailable as exc:
        return _undecided(target, pending, exc)
    return _record(target, pending, decisions)


async def adecide(request: HttpRequest,
                  rules: Sequence[Rule]) -> list[Decision] | HttpResponse:
    """Async twin of :func:`decide` (redis.asyncio, no thread hop)."""
    if any(getattr(r.key, "needs_user", False) for r in rules):
        # Resolve the lazy user without a sync DB call inside the event loop.
        if hasattr(request, "auser"):
            request.user = await request.auser()
        elif hasattr(request, "user"):  # Django 4.2: no auser(); evaluate it in a thread
            await sync_to_async(_evaluate_user)(request)
    pending = _pending(request, rules)
    if not pending:
        return []
    try:
        if len(pending) == 1:
            rule, limiter, identity = pending[0]
            decisions = [await limiter.ahit(identity, rule.cost)]
        else:
            decisions = await ahit_many(
                [(lim, ident, r.cost, None) for r, lim, ident in pending])
    except BackendUnavailable as exc:
        return _undecided(request, pending, exc)
    return _record(request, pending, decisions)


def check(request: HttpRequest, rules: Sequence[Rule]) -> HttpResponse | None:
    """Decide ``rules`` for ``request``; the response to send instead, or ``None``."""
    outcome = decide(request, rules)
    if isinstance(outcome, HttpResponse):
        return outcome
    if not outcome:
        return None
    response = blocked_response(request, outcome)
    if inspect.isawaitable(response):
        response = async_to_sync(_await)(response)
    return response


async def acheck(request: HttpRequest, rules: Sequence[Rule]) -> HttpResponse | None:
    """Async twin of :func:`check`."""
    outcome = await adecide(request, rules)
    if isinstance(outcome, HttpResponse):
        return outcome
    if not outcome:
        return None
    view = custom_view()
    if view is None or inspect.iscoroutinefunction(view):
        response = blocked_response(request, outcome)  # no thread hop
    else:
        response = await sync_to_async(blocked_response)(request, outcome)
    if inspect.isawaitable(response):
        response = await response
    return response


def _evaluate_user(request: HttpRequest) -> None:
    request.user.is_authenticated  # noqa: B018 - forces the lazy object's DB lookup


async def _await(awaitable: Any) -> Any:
    return await awaitable


# --- recording --------------------------------------------------------------------------


def _record(request: HttpRequest, pending: Sequence[Pending],
            decisions: Sequence[Decision]) -> list[Decision]:
    """Put the decisions on the request, log and signal blocks; the blocking ones."""
    if ratelimit_decided.receivers:  # nothing to build on the hot path unless someone listens
        _announce(request, pending, decisions)
    seen: list[Decision] | None = getattr(request, DECISIONS_ATTR, None)
    if seen is None and len(decisions) == 1:
        decision = decisions[0]
        if decision.allowed and not pending[0][0].shadow:  # the common case, in one step
            request.__dict__.update({DECISIONS_ATTR: [decision], "ratelimit": decision,
                                     "limited": getattr(request, "limited", False)})
            return []
    if seen is None:
        seen = []
        setattr(request, DECISIONS_ATTR, seen)
    limited = getattr(request, "limited", False)
    blocking = []
    shadow: list[Decision] | None = None
    for (rule, limiter, identity), decision in zip(pending, decisions, strict=True):
        if rule.shadow:
            shadow = shadow if shadow is not None else _shadow_list(request)
            shadow.append(decision)
            if not decision.allowed:
                _report(request, rule, limiter, identity, decision, shadow=True)
            continue
        seen.append(decision)
        if not decision.allowed:
            _report(request, rule, limiter, identity, decision, shadow=False)
            limited = True
            if rule.block:
                blocking.append(decision)
    request.limited = limited  # type: ignore[attr-defined]  # django-ratelimit's name
    if seen:
        request.ratelimit = binding(seen)  # type: ignore[attr-defined]
    elif not hasattr(request, "ratelimit") and shadow:
        # Only shadow rules ran: the view sees what it experienced, an admitted request.
        request.ratelimit = shadow[0]._replace(  # type: ignore[attr-defined]
            allowed=True, retry_after=0.0)
    return blocking


def _announce(request: HttpRequest, pending: Sequence[Pending],
              decisions: Sequence[Decision]) -> None:
    for (rule, limiter, _), decision in zip(pending, decisions, strict=True):
        ratelimit_decided.send(sender=RateLimiter, request=request, rule=rule.label(limiter),
                               decision=decision, shadow=rule.shadow)


def _shadow_list(request: HttpRequest) -> list[Decision]:
    shadow: list[Decision] | None = getattr(request, SHADOW_ATTR, None)
    if shadow is None:
        shadow = []
        setattr(request, SHADOW_ATTR, shadow)
    return shadow


def _report(request: HttpRequest, rule: Rule, limiter: RateLimiter, identity: str,
            decision: Decision, *, shadow: bool) -> None:
    digest = limiter.digest(identity)
    label = rule.label(limiter)
    logger.info(
        "rate limit %s %s %s: rule %s, identity %s, retry after %.1fs",
        "would block (shadow rule)" if shadow else "blocked", request.method, request.path,
        label, digest, decision.retry_after,
    )
    ratelimit_blocked.send(sender=RateLimiter, request=request, rule=label,
                           decision=decision, identity=digest, shadow=shadow)


def _undecided(request: HttpRequest, pending: Sequence[Pending],
               exc: BackendUnavailable) -> list[Decision] | HttpResponse:
    """Redis could not answer: record undecided decisions, then fail open or closed.

    Shadow rules never block, so a request that only they cover is always let through.
    """
    fail_open = get_config().feature("RATELIMIT")["FAIL_OPEN"]
    enforced = any(not rule.shadow for rule, _, _ in pending)
    let_through = fail_open or not enforced
    logger.warning(
        "rate limit backend unavailable (%s) for %s %s; %s", exc, request.method,
        request.path, "letting the request through (FAIL_OPEN)" if let_through
        else "answering 503",
    )
    if ratelimit_unavailable.receivers:
        ratelimit_unavailable.send(
            sender=RateLimiter, request=request, failed_open=let_through,
            rules=tuple(rule.label(limiter) for rule, limiter, _ in pending))
    _record(request, pending,
            [Decision.undecided(limiter, rule.cost) for rule, limiter, _ in pending])
    if let_through:
        return []
    return unavailable_response(request)
