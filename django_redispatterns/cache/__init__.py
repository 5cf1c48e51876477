"""Stampede-safe Django cache backend, memoizing decorator and commit-time invalidation.

``CACHES = {"default": {"BACKEND": "django_redispatterns.cache.RedisCache", ...}}`` —
see docs/cache.md for the guarantees, options and failure behaviour.
"""

from __future__ import annotations

from ..exceptions import MissingTTLError
from .backend import RedisCache
from .decorators import cached, invalidate_on_commit

__all__ = ["MissingTTLError", "RedisCache", "cached", "invalidate_on_commit"]
