"""``IdempotencyMiddleware``: idempotency keys for every view (sync under WSGI, async under ASGI).

Put it **last** in ``MIDDLEWARE`` (after sessions, authentication and CSRF): it decides in
``process_view``, so a request that CSRF or a rate limiter refuses never takes a claim, and
it finishes in ``__call__`` once the view's response comes back. Views decorated with
``@idempotent`` (their own settings) or ``@idempotent_exempt`` are left alone, also when the
decorator sits on a class-based view's method (``method_decorator``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from ..idempotency import decide, settle
from ..idempotency.decorators import handled_elsewhere
from ..idempotency.options import options

_TICKET = "_redispatterns_idempotency"


class IdempotencyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            self.process_view = self._aprocess_view  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        try:
            response = self.get_response(request)
        except BaseException:
            ticket = request.__dict__.pop(_TICKET, None)
            if ticket is not None:
                settle.release(ticket)
            raise
        ticket = request.__dict__.pop(_TICKET, None)
        return settle.finish(ticket, response) if ticket is not None else response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        try:
            response = await self.get_response(request)
        except BaseException:
            ticket = request.__dict__.pop(_TICKET, None)
            if ticket is not None:
                await settle.arelease(ticket)
            raise
        ticket = request.__dict__.pop(_TICKET, None)
        return await settle.afinish(ticket, response) if ticket is not None else response

    def process_view(self, request: HttpRequest, view: Callable[..., Any], args: Any,
                     kwargs: Any) -> HttpResponseBase | None:
        if handled_elsewhere(request, view):
            return None
        return self._keep(request, decide.start(request, options()))

    async def _aprocess_view(self, request: HttpRequest, view: Callable[..., Any], args: Any,
                             kwargs: Any) -> HttpResponseBase | None:
        if handled_elsewhere(request, view):
            return None
        return self._keep(request, await decide.astart(request, options()))

    @staticmethod
    def _keep(request: HttpRequest, decision: decide.Decision) -> HttpResponseBase | None:
        if isinstance(decision, settle.Ticket):
            request.__dict__[_TICKET] = decision
            return None
        return decision


__all__ = ["IdempotencyMiddleware"]
