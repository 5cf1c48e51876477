"""Static cache checks: a Redis-backed cache whose entries never expire."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Tags, register

from .messages import E001, TAG, W001
from .project import redis_caches


@register(TAG, Tags.caches)
def check_cache_ttls(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E001/W001: a Redis-backed cache whose entries never expire."""
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        if "TIMEOUT" in entry and entry["TIMEOUT"] is None:
            options = entry.get("OPTIONS") or {}
            allowed = options.get("ALLOW_NO_TTL") is True
            messages.append((W001 if allowed else E001)(obj=f"CACHES[{alias!r}]", alias=alias))
    return messages


