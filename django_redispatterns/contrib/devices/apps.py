from __future__ import annotations

import logging

from django.apps import AppConfig

logger = logging.getLogger("django_redispatterns.sessions")


class DevicesConfig(AppConfig):
    """Optional: adds the "Log out everywhere" user-admin action when
    ``REDIS_PATTERNS["SESSIONS"]["ADMIN_LOGOUT_ACTION"]`` is True. The devices pages work
    without this app being installed (their templates ship with ``django_redispatterns``)."""

    name = "django_redispatterns.contrib.devices"
    label = "redispatterns_devices"
    verbose_name = "Redis patterns: devices"

    def ready(self) -> None:
        from django_redispatterns.conf import get_config

        if not get_config().feature("SESSIONS")["ADMIN_LOGOUT_ACTION"]:
            return
        from .admin import add_logout_everywhere_action

        if not add_logout_everywhere_action():
            logger.warning(
                "ADMIN_LOGOUT_ACTION: the user model is not registered in admin.site (is "
                "django.contrib.admin installed, and listed before %s?)", self.name)
