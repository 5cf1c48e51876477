"""HTTP adapters: thin middleware that turn requests into calls on the feature modules.

``django_redispatterns.middleware.RateLimitMiddleware``,
``django_redispatterns.middleware.IdempotencyMiddleware`` and
``django_redispatterns.middleware.SessionActivityMiddleware`` are the dotted paths for
``MIDDLEWARE``; each lives in its own submodule and is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RateLimitMiddleware": ".ratelimit",
    "IdempotencyMiddleware": ".idempotency",
    "SessionActivityMiddleware": ".sessions",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
