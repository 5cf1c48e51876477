"""``SessionActivityMiddleware``: device metadata for the session index, and SPEC D3.

Install it directly **above** Django's ``SessionMiddleware``::

    MIDDLEWARE = [
        ...,
        "django_redispatterns.middleware.SessionActivityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        ...,
    ]

It does two things:

* records ``last_activity``, the client IP (truncated, hashed or dropped, per
  ``SESSIONS["IP_STORAGE"]``) and the user agent of signed-in sessions, at most once per
  ``SESSIONS["ACTIVITY_INTERVAL"]`` seconds, in the same round trip as the session save
  when there is one;
* turns a request that failed because the session store was unreachable into a **503**
  with ``Retry-After`` and no ``Set-Cookie`` — the browser keeps its session cookie and the
  user is still signed in once Redis is back (Django's cache engine deletes the cookie).
  Sitting outside ``SessionMiddleware`` lets it see failures of the session save too.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from .. import keys
from ..conf import get_config
from ..exceptions import ConfigurationError
from ..sessions import USER_AGENT_MAX, SessionStore, current_activity

logger = logging.getLogger("django_redispatterns.sessions")

RETRY_AFTER_SECONDS = 5
DJANGO_SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"


def stored_ip(address: str) -> str:
    """The client address as ``SESSIONS["IP_STORAGE"]`` says to keep it.

    ``"truncate"``: the /24 (IPv4) or /48 (IPv6) network; ``"hash"``: a keyed hash (SPEC D6);
    ``"none"``: nothing. Unparsable addresses are kept as ``""``.
    """
    mode = get_config().feature("SESSIONS")["IP_STORAGE"]
    if mode == "none" or not address:
        return ""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return ""
    if mode == "hash":
        return keys.identity_hash(ip.compressed, purpose="sessions.ip")[:16]
    prefix = 24 if ip.version == 4 else 48
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def activity_of(request: HttpRequest) -> tuple[str, str]:
    """(stored ip, truncated user agent) of a request."""
    user_agent = request.META.get("HTTP_USER_AGENT", "")
    return stored_ip(request.META.get("REMOTE_ADDR", "")), user_agent[:USER_AGENT_MAX]


def unavailable_response() -> HttpResponse:
    """503, RFC 9457 problem+json with the stable code ``session_store_unavailable``."""
    body = {"type": "about:blank", "title": "Service Unavailable", "status": 503,
            "code": "session_store_unavailable",
            "detail": "The session store is unreachable; please retry shortly."}
    response = HttpResponse(json.dumps(body), status=503,
                            content_type="application/problem+json")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response


def _check_order() -> None:
    names = [str(m) for m in getattr(settings, "MIDDLEWARE", [])]
    ours = [i for i, m in enumerate(names) if m.endswith("SessionActivityMiddleware")]
    if ours and DJANGO_SESSION_MIDDLEWARE in names and ours[0] > names.index(
        DJANGO_SESSION_MIDDLEWARE
    ):
        raise ConfigurationError(
            "MIDDLEWARE: put 'django_redispatterns.middleware.SessionActivityMiddleware' "
            f"above {DJANGO_SESSION_MIDDLEWARE!r}, so that it sees failures of the session save."
        )


class SessionActivityMiddleware:
    """Records session activity and answers 503 (cookie untouched) when Redis is down."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        _check_order()
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        activity = activity_of(request)
        token = current_activity.set(activity)
        try:
            response = self.get_response(request)
        finally:
            current_activity.reset(token)
        return self.finish(request, response, activity)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        activity = activity_of(request)
        token = current_activity.set(activity)
        try:
            response = await self.get_response(request)
        finally:
            current_activity.reset(token)
        return await sync_to_async(self.finish)(request, response, activity)

    def finish(self, request: HttpRequest, response: HttpResponseBase,
               activity: tuple[str, str]) -> HttpResponseBase:
        session = getattr(request, "session", None)
        if not isinstance(session, SessionStore):
            return response
        if session.backend_error is not None and response.status_code >= 500:
            logger.warning("%s %s: session store unavailable, answering 503 (cookie kept)",
                           request.method, request.path)
            return unavailable_response()
        if response.status_code < 500:
            session.record_activity(activity)
        return response
