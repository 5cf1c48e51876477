"""What the cache does when Redis cannot serve it: django-redis's ``IGNORE_EXCEPTIONS``.

With it, a failed call is logged and answers as a miss (reads), a skipped write, or the
callable's own value (``get_or_set``); without it, the redis-py exception reaches the
caller. See docs/cache.md, "Failure behaviour".
"""

from __future__ import annotations

import logging
import socket
from typing import Protocol, TypeVar

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger("django_redispatterns.cache")

# "Redis cannot serve this now": also a demoted primary (READONLY), a full one (OOM) and
# Redis Cluster's CLUSTERDOWN / TRYAGAIN / "TTL exhausted" (django-redis's
# IGNORE_EXCEPTIONS treats every ResponseError this way).
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, redis.exceptions.ReadOnlyError,
                redis.exceptions.OutOfMemoryError, redis.exceptions.ClusterError,
                redis.exceptions.TryAgainError, redis.exceptions.SlotNotCoveredError,
                socket.timeout, OSError)

T = TypeVar("T")


class Settings(Protocol):
    """django-redis's failure settings, as its backend holds them (read at each call)."""

    _ignore_exceptions: bool
    _log_ignored_exceptions: bool
    logger: logging.Logger | None


def degrade(owner: Settings, operation: str, exc: BaseException, fallback: T) -> T:
    """Redis failed: with IGNORE_EXCEPTIONS log and return ``fallback``, else raise."""
    if not owner._ignore_exceptions:
        raise exc
    if owner._log_ignored_exceptions and owner.logger is not None:
        # The project routed these with DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS/_LOGGER:
        # log exactly as django-redis does, once.
        owner.logger.exception("Exception ignored")
    else:
        logger.warning("cache %s failed, continuing without Redis: %s", operation, exc)
    return fallback
