"""The "Your devices" views: list the signed-in user's sessions, end one, end all others.

Every view requires a signed-in user; the two POST views are CSRF-protected whether or not
the project runs ``CsrfViewMiddleware``. A session is named in the page and in forms only by
its handle (a hash of the session key, which the session engine stores instead of the key),
so the page never shows a cookie value. Ending a device deletes the session in Redis at
once: its next request is anonymous.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST

from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.sessions import (
    logout_everywhere,
    revoke_session,
    session_handle,
    user_sessions,
)

from .useragent import parse_user_agent

logger = logging.getLogger("django_redispatterns.sessions")

app_name = "redispatterns_devices"
LIST_TEMPLATE = "redispatterns/devices.html"
UNAVAILABLE_TEMPLATE = "redispatterns/devices_unavailable.html"
HANDLE_RE = re.compile(r"[0-9a-f]{32}")

__all__ = ["Device", "device_list", "end_device", "end_other_devices"]


@dataclass(frozen=True)
class Device:
    """One row of the page (the template's ``devices`` list)."""

    handle: str
    browser: str
    os: str
    kind: str
    user_agent: str
    ip: str
    created: datetime | None
    last_activity: datetime | None
    expires: datetime | None
    is_current: bool


def _devices(request: HttpRequest) -> list[Device]:
    current = request.session.session_key
    rows = []
    for info in user_sessions(request.user, current=current):
        agent = parse_user_agent(info.user_agent)
        rows.append(Device(
            handle=info.handle, browser=agent.browser, os=agent.os, kind=agent.device,
            user_agent=info.user_agent, ip=info.ip, created=info.created,
            last_activity=info.last_activity, expires=info.expires,
            is_current=info.is_current,
        ))
    rows.sort(key=lambda d: not d.is_current)  # this device first, then most recent
    return rows


def _unavailable(request: HttpRequest, exc: BackendUnavailable) -> HttpResponse:
    logger.error("devices page: session store unavailable: %s", exc)
    response = render(request, UNAVAILABLE_TEMPLATE, status=503)
    response["Retry-After"] = "5"
    return response


def _url(request: HttpRequest, name: str) -> str:
    """The URL of view ``name`` under whatever namespace the project included the URLs."""
    match = request.resolver_match
    return reverse(f"{match.namespace if match and match.namespace else app_name}:{name}")


def _back(request: HttpRequest, **query: int) -> HttpResponseRedirect:
    url = _url(request, "list")
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return HttpResponseRedirect(url)


@never_cache
@login_required
@require_GET
@ensure_csrf_cookie  # the forms work without CsrfViewMiddleware too
def device_list(request: HttpRequest) -> HttpResponse:
    """The page: every live session of the user, this device first and marked."""
    try:
        devices = _devices(request)
    except BackendUnavailable as exc:
        return _unavailable(request, exc)
    ended = request.GET.get("ended", "")
    context = {
        "devices": devices,
        "others": [d for d in devices if not d.is_current],
        "ended": int(ended) if ended.isdigit() else None,
        "end_url": _url(request, "end"),
        "end_others_url": _url(request, "end-others"),
    }
    return render(request, LIST_TEMPLATE, context)


@never_cache
@login_required
@require_POST
@csrf_protect
def end_device(request: HttpRequest) -> HttpResponse:
    """End the session named by the ``device`` field (a handle of one of the user's own
    sessions; another user's handle ends nothing). Ending this device signs it out."""
    handle = request.POST.get("device", "")
    if not HANDLE_RE.fullmatch(handle):
        return HttpResponseBadRequest("the device field must be a device handle")
    current = request.session.session_key
    if current and session_handle(current) == handle:
        logout(request)
        return _back(request)
    try:
        ended = revoke_session(request.user, handle)
    except BackendUnavailable as exc:
        return _unavailable(request, exc)
    return _back(request, ended=int(ended))


@never_cache
@login_required
@require_POST
@csrf_protect
def end_other_devices(request: HttpRequest) -> HttpResponse:
    """End every session of the user except this one."""
    try:
        count = logout_everywhere(request.user, keep=request.session.session_key)
    except BackendUnavailable as exc:
        return _unavailable(request, exc)
    return _back(request, ended=count)
