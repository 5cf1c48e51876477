"""Static session checks: our session engine with a serializer that unpickles."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, register

from .messages import OUR_SESSION_ENGINE, TAG, W002
from .project import pickles


@register(TAG, Tags.security)
def check_session_serializer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W002: our session engine with a serializer that unpickles."""
    engine = getattr(settings, "SESSION_ENGINE", "")
    if engine != OUR_SESSION_ENGINE:
        return []
    serializer = getattr(settings, "SESSION_SERIALIZER",
                         "django.contrib.sessions.serializers.JSONSerializer")
    if pickles(serializer, lambda cls: cls()):
        return [W002(obj="SESSION_SERIALIZER", engine=engine, serializer=serializer)]
    return []
