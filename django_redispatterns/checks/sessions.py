"""Static session checks: our session engine with a serializer that unpickles."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, register
from django.utils.module_loading import import_string

from .messages import OUR_SESSION_ENGINE, TAG, W002


@register(TAG, Tags.security)
def check_session_serializer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W002: our session engine with a serializer that unpickles."""
    engine = getattr(settings, "SESSION_ENGINE", "")
    if engine != OUR_SESSION_ENGINE:
        return []
    serializer = getattr(settings, "SESSION_SERIALIZER",
                         "django.contrib.sessions.serializers.JSONSerializer")
    if _pickles(serializer):
        return [W002(obj="SESSION_SERIALIZER", engine=engine, serializer=serializer)]
    return []


def _pickles(serializer: str) -> bool:
    if "pickle" in serializer.lower():
        return True
    try:
        data = import_string(serializer)().dumps({"probe": 1})
    except Exception:  # an unimportable serializer fails loudly on first use anyway
        return False
    # Pickle protocols >= 2 start with the PROTO opcode.
    return isinstance(data, (bytes, bytearray)) and data[:1] == b"\x80"


