"""Sessions demo: "your devices" from the per-user index, and log out everywhere else.

Sign in at /accounts/login/ (``manage.py create_demo_user`` makes demo / demo-password),
then sign in again from a private window or another browser to see a second device.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods

from django_redispatterns.sessions import logout_everywhere, revoke_session, user_sessions


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return render(request, "demo/sessions.html", {"signed_in": False})
    current = request.session.session_key
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "others":
            count = logout_everywhere(request.user, keep=current)
            messages.info(request, f"Signed out {count} other session(s).")
        elif action == "revoke":
            handle = request.POST.get("handle", "")
            done = revoke_session(request.user, handle)
            messages.info(request, "Signed out that device." if done else "No such session.")
        return redirect("sessions:index")
    return render(request, "demo/sessions.html", {
        "signed_in": True,
        "sessions": user_sessions(request.user, current=current),
    })


urlpatterns = [path("", index, name="index")]
