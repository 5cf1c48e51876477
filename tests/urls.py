"""Default URLconf of the test suite. Feature tests use their own via override_settings."""

from __future__ import annotations

urlpatterns: list[object] = []
