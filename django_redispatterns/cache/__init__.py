"""Stampede-safe Django cache backend, memoizing decorator and commit-time invalidation.

``CACHES = {"default": {"BACKEND": "django_redispatterns.cache.RedisCache", ...}}`` —
see docs/cache.md for the guarantees, options and failure behaviour.
"""

from __future__ import annotations

from ..exceptions import MissingTTLError, UncacheableArgument, UnscopedKeysError
from .backend import RedisCache
from .decorators import cached, invalidate_on_commit
from .scope import problem as key_scope_problem

__all__ = ["MissingTTLError", "RedisCache", "UncacheableArgument", "UnscopedKeysError", "cached",
           "invalidate_on_commit", "key_scope_problem"]
