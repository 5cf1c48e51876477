from __future__ import annotations

from django.apps import AppConfig


class MetricsConfig(AppConfig):
    """Connects the metric receivers to the app's signals when Django starts."""

    name = "django_redispatterns.contrib.metrics"
    label = "redispatterns_metrics"
    verbose_name = "Redis patterns: Prometheus metrics"

    def ready(self) -> None:
        from .receivers import connect

        connect()
