from __future__ import annotations

import os

from django.conf import settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from soak import config
from soak.app import views

ASYNC = os.environ.get("SOAK_ASYNC_VIEWS") == "1" and settings.STACK == "ours"


def pick(sync_view, async_view):  # type: ignore[no-untyped-def]
    return async_view if ASYNC else sync_view


urlpatterns = [
    path(route.lstrip("/"), views.limited_view(name, pick(views.ok, views.aok)), name=name)
    for name, (route, _rate, _algorithm, _burst) in config.rate_routes().items()
]
urlpatterns += [
    path("cached/<int:n>", pick(views.cached, views.acached), {"alias": "default"}),
    path("cached-swr/<int:n>", pick(views.cached, views.acached), {"alias": "swr"}),
    path("me", pick(views.me, views.ame)),
    path("signin", csrf_exempt(pick(views.signin, views.asignin))),
    path("orders", csrf_exempt(pick(views.orders, views.aorders))),
]
if settings.STACK == "ours":
    urlpatterns.append(path("logout-everywhere", csrf_exempt(
        pick(views.logout_everywhere_view, views.alogout_everywhere_view))))
