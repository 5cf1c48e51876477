"""``@idempotent`` and ``@idempotent_exempt``: idempotency keys for one view."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from inspect import iscoroutinefunction
from typing import Any, TypeVar, cast

from django.http import HttpRequest

from . import decide, settle
from .options import ScopeFunc, current, validated_overrides

V = TypeVar("V", bound=Callable[..., Any])

HANDLED_ATTR = "idempotency_handled"


def idempotent(
    view: V | None = None,
    *,
    ttl: float | None = None,
    required: bool | None = None,
    methods: Collection[str] | None = None,
    lease: float | None = None,
    max_lease: float | None = None,
    max_body_bytes: int | None = None,
    scope: ScopeFunc | None = None,
) -> Any:
    """Make a view (sync or async) honour ``Idempotency-Key`` (see docs/idempotency.md).

    Arguments override ``REDIS_PATTERNS['IDEMPOTENCY']`` for this view. ``scope`` is a
    callable ``request -> str | None`` naming whom the keys belong to (default: the user id,
    else the session key). Usable bare (``@idempotent``) or with arguments. With the
    middleware installed as well, the decorator's settings win for this view.
    """
    overrides = validated_overrides({
        "ttl": ttl, "required": required, "methods": methods, "lease": lease,
        "max_lease": max_lease, "max_body_bytes": max_body_bytes, "scope": scope})

    def decorate(func: V) -> V:
        if iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                decision = await decide.astart(request, current(overrides))
                if not isinstance(decision, settle.Ticket):
                    return decision if decision is not None else await func(
                        request, *args, **kwargs)
                try:
                    response = await func(request, *args, **kwargs)
                except BaseException:
                    await settle.arelease(decision)
                    raise
                return await settle.afinish(decision, response)

            setattr(async_view, HANDLED_ATTR, True)
            return cast(V, async_view)

        @functools.wraps(func)
        def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            decision = decide.start(request, current(overrides))
            if not isinstance(decision, settle.Ticket):
                return decision if decision is not None else func(request, *args, **kwargs)
            try:
                response = func(request, *args, **kwargs)
            except BaseException:
                settle.release(decision)
                raise
            return settle.finish(decision, response)

        setattr(sync_view, HANDLED_ATTR, True)
        return cast(V, sync_view)

    return decorate(view) if view is not None else decorate


def idempotent_exempt(view: V) -> V:
    """Keep :class:`IdempotencyMiddleware` away from this view."""
    setattr(view, HANDLED_ATTR, True)
    return view


def handled_elsewhere(request: HttpRequest, view: Callable[..., Any]) -> bool:
    """True for views marked ``@idempotent``/``@idempotent_exempt``, including class-based
    views (Django's and DRF's) whose handler method for this request carries the mark."""
    if getattr(view, HANDLED_ATTR, False):
        return True
    cls = getattr(view, "view_class", None) or getattr(view, "cls", None)
    if cls is None or not request.method:
        return False
    return bool(getattr(getattr(cls, request.method.lower(), None), HANDLED_ATTR, False))
