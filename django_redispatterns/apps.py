from __future__ import annotations

from django.apps import AppConfig


class RedisPatternsConfig(AppConfig):
    name = "django_redispatterns"
    verbose_name = "Redis patterns"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Importing registers the system checks and the signal receivers.
        from . import checks, receivers  # noqa: F401
