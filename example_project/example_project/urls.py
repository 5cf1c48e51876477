from __future__ import annotations

from importlib import import_module

from demo.views import FEATURES, home
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # The ready-made "Your devices" page (docs/sessions.md).
    path("account/devices/", include("django_redispatterns.contrib.devices.urls")),
]

# Each feature's demo page lives in demo/features/<slug>.py with its own urlpatterns.
for feature in FEATURES:
    module = import_module(f"demo.features.{feature.slug}")
    urlpatterns.append(path(f"{feature.slug}/", include((module.urlpatterns, feature.slug))))
