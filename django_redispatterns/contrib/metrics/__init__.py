"""Prometheus metrics for every feature, from the app's signals.

Install the extra (``pip install "django-redispatterns[metrics]"``) and add
``"django_redispatterns.contrib.metrics"`` to ``INSTALLED_APPS``. Counters and histograms
then live in ``prometheus_client``'s default registry, beside whatever else exports there
(django-prometheus's ``/metrics`` view, ``prometheus_client.start_http_server``, ...).
Labels are rule names and outcomes only, never identities, keys or lock names, so the
number of series stays bounded. Every metric is listed in docs/metrics.md.

:func:`connect` / :func:`disconnect` do the same by hand (``connect`` is idempotent).
"""

from __future__ import annotations

from .receivers import METRICS, connect, disconnect

__all__ = ["METRICS", "connect", "disconnect"]
