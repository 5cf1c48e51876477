"""Test helpers that paper over Django versions (4.2 lacks the 5.0 async auth API)."""

from __future__ import annotations

from typing import Any

import django
import pytest
from asgiref.sync import sync_to_async

requires_django_5 = pytest.mark.skipif(
    django.VERSION < (5, 0), reason="Django 5.0+ API (async sessions/auth)"
)


async def aforce_login(client: Any, user: Any) -> None:
    """``AsyncClient.aforce_login`` (Django 5.0+), else ``force_login`` off the event loop."""
    if hasattr(client, "aforce_login"):
        await client.aforce_login(user)
    else:
        await sync_to_async(client.force_login)(user)
