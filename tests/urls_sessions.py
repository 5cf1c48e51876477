"""URLconf of the session tests: small views that read, write, log in and revoke sessions."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth import authenticate, login, logout, update_session_auth_hash
from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_redispatterns.sessions import logout_everywhere

# A test may install a callable run inside the view (e.g. kill Redis mid-request).
during_view: list[Callable[[], object]] = []


def whoami(request: HttpRequest) -> JsonResponse:
    for hook in during_view:
        hook()
    user = request.user
    return JsonResponse({
        "user": user.get_username() if user.is_authenticated else None,
        "data": request.session.get("data"),
    })


def write(request: HttpRequest, value: str) -> JsonResponse:
    request.session["data"] = value
    for hook in during_view:
        hook()
    return JsonResponse({"data": value})


def do_login(request: HttpRequest) -> HttpResponse:
    user = authenticate(request, username=request.POST["username"],
                        password=request.POST["password"])
    if user is None:
        return JsonResponse({"error": "bad credentials"}, status=400)
    login(request, user)
    return JsonResponse({"user": user.get_username()})


def do_logout(request: HttpRequest) -> JsonResponse:
    logout(request)
    return JsonResponse({"user": None})


def change_password(request: HttpRequest) -> JsonResponse:
    user = request.user
    assert isinstance(user, AbstractBaseUser)
    user.set_password(request.POST["password"])
    user.save()
    update_session_auth_hash(request, user)
    return JsonResponse({"changed": True})


def everywhere_else(request: HttpRequest) -> JsonResponse:
    count = logout_everywhere(request.user, keep=request.session.session_key)
    return JsonResponse({"revoked": count})


def revoked_while_running(request: HttpRequest) -> JsonResponse:
    """A concurrent logout-everywhere lands while this request still holds its session."""
    request.session["data"] = "before"
    logout_everywhere(request.user)
    request.session["data"] = "after"
    return JsonResponse({"data": "after"})


def untouched(request: HttpRequest) -> HttpResponse:
    return HttpResponse("no session access")


urlpatterns = [
    path("untouched/", untouched),
    path("whoami/", whoami),
    path("write/<str:value>/", write),
    path("login/", do_login),
    path("logout/", do_logout),
    path("password/", change_password),
    path("everywhere-else/", everywhere_else),
    path("revoked-while-running/", revoked_while_running),
]
