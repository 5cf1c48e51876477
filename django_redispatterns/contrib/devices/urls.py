"""Include in a project's URLconf::

    path("account/devices/", include("django_redispatterns.contrib.devices.urls")),

The names are namespaced ``redispatterns_devices``: ``list``, ``end`` and ``end-others``.
"""

from __future__ import annotations

from django.urls import path

from .views import app_name, device_list, end_device, end_other_devices

__all__ = ["app_name", "urlpatterns"]

urlpatterns = [
    path("", device_list, name="list"),
    path("end/", end_device, name="end"),
    path("end-others/", end_other_devices, name="end-others"),
]
