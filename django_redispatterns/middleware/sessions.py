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
  Browsers (``Accept`` prefers ``text/html``) get the page
  ``redispatterns/sessions_unavailable.html`` (override it in your templates), API
  clients RFC 9457 problem+json; the server log gets one WARNING line, not Django's
  "Internal Server Error" traceback.
  Wrapping ``SessionMiddleware`` lets it see a failed session save too. Placed after
  ``SessionMiddleware`` instead, it keeps the same guarantees by saving the session itself
  (``SessionMiddleware``'s own save of that same state is then a no-op).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.sessions.backends.base import UpdateError
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template import TemplateDoesNotExist, loader

from .. import keys
from ..conf import get_config
from ..exceptions import BackendUnavailable
from ..problems import problem_response
from ..sessions import USER_AGENT_MAX, SessionStore, SessionStoreUnavailable, current_activity

logger = logging.getLogger("django_redispatterns.sessions")

RETRY_AFTER_SECONDS = 5
UNAVAILABLE_TEMPLATE = "redispatterns/sessions_unavailable.html"
# Served when no template engine finds UNAVAILABLE_TEMPLATE (e.g. APP_DIRS off).
FALLBACK_PAGE = (
    "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<title>Temporarily unavailable</title></head><body><h1>Temporarily unavailable</h1>"
    "<p>Please try again in {retry_after} seconds; you are still signed in.</p>"
    "</body></html>"
)
_ANSWERED = "_redispatterns_session_unavailable"  # marks our 503 on the response


def stored_ip(address: str) -> str:
    """The client address as ``SESSIONS["IP_STORAGE"]`` says to keep it.

    ``"truncate"``: the /24 (IPv4) or /48 (IPv6) network; ``"hash"``: a keyed hash;
    ``"none"``: nothing. Unparsable addresses are kept as ``""``.
    """
    mode = get_config().feature("SESSIONS")["IP_STORAGE"]
    if mode == "none" or not address:
        return ""
    return _stored_ip(address, mode, settings.SECRET_KEY if mode == "hash" else "")


@functools.lru_cache(maxsize=4096)
def _stored_ip(address: str, mode: str, secret: str) -> str:
    # ``secret`` is only part of the cache key: a rotated SECRET_KEY gives new hashes.
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


def prefers_html(accept: str) -> bool:
    """Whether an ``Accept`` header ranks HTML above JSON (a browser, not an API client).

    Only explicit media types count: ``*/*`` or no header at all means JSON.
    """
    best_html = best_json = 0.0
    for part in accept.split(","):
        media, _, params = part.partition(";")
        media = media.strip().lower()
        quality = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if media in ("text/html", "application/xhtml+xml"):
            best_html = max(best_html, quality)
        elif media == "application/json" or media.endswith("+json"):
            best_json = max(best_json, quality)
    return best_html > 0 and best_html > best_json


def _page() -> str:
    context = {"retry_after": RETRY_AFTER_SECONDS}
    try:
        return loader.render_to_string(UNAVAILABLE_TEMPLATE, context)
    except TemplateDoesNotExist:
        return FALLBACK_PAGE.format(**context)


def unavailable_response(request: HttpRequest | None = None) -> HttpResponse:
    """503 with ``Retry-After``, ``no-store`` and no cookie, shaped for who asked.

    An HTML page (the template ``redispatterns/sessions_unavailable.html``) when the
    request's ``Accept`` prefers HTML; otherwise RFC 9457 problem+json with the stable code
    ``session_store_unavailable``. Marked as logged, so Django's handler adds no ERROR line.
    """
    if request is not None and prefers_html(request.META.get("HTTP_ACCEPT", "")):
        response = HttpResponse(_page(), status=503, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    else:
        response = problem_response(
            503, "session_store_unavailable",
            "The session store is unreachable; please retry shortly.",
            retry_after=RETRY_AFTER_SECONDS,
        )
    response["Cache-Control"] = "no-store"
    response["Vary"] = "Accept"
    # The answer is deliberate and logged once by the middleware (a warning), not an error.
    response._has_been_logged = True  # type: ignore[attr-defined]
    setattr(response, _ANSWERED, True)
    return response


class SessionActivityMiddleware:
    """Records session activity and answers 503 (cookie untouched) when Redis is down."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        # Directly above SessionMiddleware, call it ourselves rather than through Django's
        # exception-to-500 wrapper, so that a failed save there is our 503, not an
        # "Internal Server Error" with a traceback in the log. Other errors go to Django's
        # own conversion, as the wrapper would have done.
        wrapped = getattr(get_response, "__wrapped__", None)
        self.session_middleware = wrapped if isinstance(wrapped, SessionMiddleware) else None
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        activity, inner = self.start(request)
        token = current_activity.set(activity)
        try:
            if self.session_middleware is None:
                response = self.get_response(request)
            else:
                try:
                    response = self.session_middleware(request)
                except SessionStoreUnavailable:
                    response = self.unavailable(request, _session_of(request))
                except Exception as exc:
                    response = response_for_exception(request, exc)
        finally:
            current_activity.reset(token)
        return self.finish(request, response, activity, inner)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        activity, inner = self.start(request)
        token = current_activity.set(activity)
        try:
            if self.session_middleware is None:
                response = await self.get_response(request)
            else:
                try:
                    response = await self.session_middleware(request)  # type: ignore[misc]
                except SessionStoreUnavailable:
                    response = await sync_to_async(self.unavailable)(
                        request, _session_of(request))
                except Exception as exc:
                    response = await sync_to_async(
                        response_for_exception, thread_sensitive=False)(request, exc)
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
        if not isinstance(session, SessionStore) or getattr(response, _ANSWERED, False):
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

    def process_exception(self, request: HttpRequest,
                          exception: Exception) -> HttpResponse | None:
        """The view hit an unreachable session store: answer the 503 here, before Django
        turns the exception into a 500 and logs it as "Internal Server Error"."""
        if not isinstance(exception, SessionStoreUnavailable):
            return None
        return self.unavailable(request, _session_of(request))

    def unavailable(self, request: HttpRequest, session: SessionStore | None) -> HttpResponse:
        logger.warning("%s %s: session store unavailable, answering 503 (cookie kept)",
                       request.method, request.path)
        if session is not None and not hasattr(session, "_session_cache"):
            # Inside SessionMiddleware: it neither saves nor sets a cookie on a 5xx, but it
            # reads the expiry first; an empty cache stops it from calling Redis again.
            session._session_cache = {}  # type: ignore[attr-defined]
        return unavailable_response(request)


def _session_of(request: HttpRequest) -> SessionStore | None:
    session = getattr(request, "session", None)
    return session if isinstance(session, SessionStore) else None


def _will_be_saved(session: SessionStore) -> bool:
    """SessionMiddleware's own test for saving a session (status < 500 checked apart)."""
    return (session.modified or settings.SESSION_SAVE_EVERY_REQUEST) and not session.is_empty()
