"""TTL discipline: every write the cache makes has a lifetime (docs/cache.md).

``timeout=None`` (Django's "forever") is refused with :class:`MissingTTLError` unless
``OPTIONS["ALLOW_NO_TTL"]``; ``OPTIONS["TTL_JITTER"]`` shortens each write's timeout by a
random fraction so keys written together do not expire together.
"""

from __future__ import annotations

import random
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from ..exceptions import MissingTTLError


class TtlPolicy:
    """Turns a Django ``timeout`` argument into the lifetime a write uses."""

    def __init__(self, *, allow_no_ttl: bool, jitter: float) -> None:
        self.allow_no_ttl = allow_no_ttl
        self.jitter = jitter

    def resolve(self, timeout: Any, default_timeout: float | None) -> float | None:
        """The timeout a write uses: the default resolved, ``None`` refused, jittered."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = default_timeout
        if timeout is None:
            if not self.allow_no_ttl:
                raise MissingTTLError(
                    "cache writes need a timeout: timeout=None would keep the key forever "
                    "(set OPTIONS['ALLOW_NO_TTL'] = True to allow it)"
                )
            return None
        if self.jitter and timeout > 0:
            # Downwards only: a value never lives longer than the caller asked.
            timeout = timeout * (1.0 - random.random() * self.jitter)
        return timeout

    def check_persist(self) -> None:
        """``persist()`` keeps a key forever: refused unless ALLOW_NO_TTL."""
        if not self.allow_no_ttl:
            raise MissingTTLError(
                "persist() would keep the key forever (set OPTIONS['ALLOW_NO_TTL'] = True)"
            )

    def counter_ttl_ms(self, default_timeout: float | None) -> int:
        """The TTL (ms) of a counter that ``incr`` creates; 0 means none (ALLOW_NO_TTL)."""
        ttl = None if self.allow_no_ttl else self.resolve(DEFAULT_TIMEOUT, default_timeout)
        return 0 if ttl is None else max(1, int(ttl * 1000))
