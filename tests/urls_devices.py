"""URLconf of the devices tests: the session test views, a plain HTML sign-in form for the
browser, and the devices pages included the way a project includes them."""

from __future__ import annotations

from django.contrib.auth import authenticate, login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.urls import include, path
from django.utils.html import escape
from django.views.decorators.csrf import csrf_protect

from tests.urls_sessions import urlpatterns as session_patterns


@csrf_protect
def sign_in(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        user = authenticate(request, username=request.POST.get("username"),
                            password=request.POST.get("password"))
        if user is not None:
            login(request, user)
            return HttpResponseRedirect("/account/devices/")
    return HttpResponse(
        '<form method="post" id="sign-in">'
        f'<input type="hidden" name="csrfmiddlewaretoken" value="{escape(get_token(request))}">'
        '<input name="username"><input name="password" type="password">'
        '<button type="submit">Sign in</button></form>'
    )


urlpatterns = [
    *session_patterns,
    path("accounts/login/", sign_in),
    path("account/devices/", include("django_redispatterns.contrib.devices.urls")),
]
