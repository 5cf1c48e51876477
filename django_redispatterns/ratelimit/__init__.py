"""Rate limiting: atomic Lua algorithms behind one small interface (docs/ratelimit.md).

``ratelimit`` (decorator), ``RateLimiter`` (programmatic) and ``Decision`` are the public
names; ``rates.parse_rate`` / ``rates.validate_rules`` validate settings without Redis.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ratelimit": ".decorators",
    "RateLimiter": ".limiter",
    "Decision": ".algorithms",
    "Rate": ".rates",
    "parse_rate": ".rates",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
