"""``SessionActivityMiddleware``: device metadata for the session index; 503 when Redis is unusable.

Install it directly **above** Django's ``SessionMiddleware`` (recommended; below it keeps
the same guarantees; the system check ``redispatterns.E009`` fires when ``SessionMiddleware``
is missing)::

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
  Wrapping ``SessionMiddleware`` lets it see a failed session save too. Placed after
  ``SessionMiddleware`` instead, it keeps the same guarantees by saving the session itself
  (``SessionMiddleware``'s own save of that same state is then a no-op).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.sessions.backends.base import UpdateError
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from .. import keys
from ..conf import get_config
from ..exceptions import BackendUnavailable
from ..problems import problem_response
from ..sessions import USER_AGENT_MAX, SessionStore, current_activity

logger = logging.getLogger("django_redispatterns.sessions")

RETRY_AFTER_SECONDS = 5


def stored_ip(address: str) -> str:
    """The client address as ``SESSIONS["IP_STORAGE"]`` says to keep it.

    ``"truncate"``: the /24 (IPv4) or /48 (IPv6) network; ``"hash"``: a keyed hash;
    ``"none"``: nothing. Unparsable addresses are kept as ``""``.
    """
    mode = get_config().feature("SESSIONS")["IP_STORAGE"]
    if mode == "none" or not address:
        return ""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:203.0.113.7 is an IPv4 client
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
    response = problem_response(
        503, "session_store_unavailable",
        "The session store is unreachable; please retry shortly.",
        retry_after=RETRY_AFTER_SECONDS,
    )
    response["Cache-Control"] = "no-store"
    return response


class SessionActivityMiddleware:
    """Records session activity and answers 503 (cookie untouched) when Redis is down."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        activity, inner = self.start(request)
        token = current_activity.set(activity)
        try:
            response = self.get_response(request)
        finally:
            current_activity.reset(token)
        return self.finish(request, response, activity, inner)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        activity, inner = self.start(request)
        token = current_activity.set(activity)
        try:
            response = await self.get_response(request)
        finally:
            current_activity.reset(token)
        return await sync_to_async(self.finish)(request, response, activity, inner)

    def start(self, request: HttpRequest) -> tuple[tuple[str, str], bool]:
        """This request's activity, and whether we run inside SessionMiddleware."""
        activity = activity_of(request)
        session = getattr(request, "session", None)
        inner = isinstance(session, SessionStore)
        if inner:
            session.pending_activity = activity  # type: ignore[union-attr]
        return activity, inner

    def finish(self, request: HttpRequest, response: HttpResponseBase,
               activity: tuple[str, str], inner: bool) -> HttpResponseBase:
        session = getattr(request, "session", None)
        if not isinstance(session, SessionStore):
            return response
        if session.backend_error is not None and response.status_code >= 500:
            return self.unavailable(request, session)
        if response.status_code >= 500:
            return response
        if inner and _will_be_saved(session):
            # Save here, where a failure can still become a 503; SessionMiddleware's own
            # save() of the same state right after is a no-op.
            try:
                session.save()
            except BackendUnavailable:
                return self.unavailable(request, session)
            except UpdateError:
                pass  # SessionMiddleware's save raises it again: 400, as Django answers
            return response
        session.record_activity(activity)
        return response

    def unavailable(self, request: HttpRequest, session: SessionStore) -> HttpResponse:
        logger.warning("%s %s: session store unavailable, answering 503 (cookie kept)",
                       request.method, request.path)
        if not hasattr(session, "_session_cache"):
            # Inside SessionMiddleware: it neither saves nor sets a cookie on a 5xx, but it
            # reads the expiry first; an empty cache stops it from calling Redis again.
            session._session_cache = {}  # type: ignore[attr-defined]
        return unavailable_response()


def _will_be_saved(session: SessionStore) -> bool:
    """SessionMiddleware's own test for saving a session (status < 500 checked apart)."""
    return (session.modified or settings.SESSION_SAVE_EVERY_REQUEST) and not session.is_empty()
