"""One exception hierarchy for the whole app.

Every error this package raises on purpose derives from :class:`RedisPatternsError`,
so ``except RedisPatternsError`` catches all of them and nothing else.
"""

from __future__ import annotations

import redis.exceptions as _redis_exceptions
from django.core.exceptions import ImproperlyConfigured


class RedisPatternsError(Exception):
    """Base class of every error raised by django_redispatterns."""


class ConfigurationError(RedisPatternsError, ImproperlyConfigured):
    """``REDIS_PATTERNS`` (or a related Django setting) is malformed.

    Also an ``ImproperlyConfigured``, so Django treats it like its own configuration errors.
    """


class ScriptError(RedisPatternsError):
    """A Lua script answered something the calling code does not understand."""


class BackendUnavailable(RedisPatternsError):
    """Redis could not be reached (or answered too slowly) for a decision that needs it."""


class ClusterUnavailable(BackendUnavailable, _redis_exceptions.ClusterError):
    """Redis Cluster kept rejecting a script (``TRYAGAIN`` while its slot migrates,
    ``CLUSTERDOWN`` during a failover) past the retry deadline; the script did not run.

    Also a ``redis.exceptions.ClusterError``, so code that maps Redis errors to its
    failure policy (fail open, 503, ...) treats it like any other Redis outage.
    """


class MissingTTLError(RedisPatternsError, ValueError):
    """A cache write asked for no expiry (``timeout=None``) without ``ALLOW_NO_TTL``."""


class UncacheableArgument(RedisPatternsError, TypeError):
    """``@cached`` cannot derive a key from an argument: its type has no known identity
    (``repr()`` is not one), or it is a model instance that is not saved yet.

    Also a ``TypeError``, like any other call with an argument of the wrong type.
    """


class UnscopedKeysError(ConfigurationError):
    """The cache cannot prove which keys are its own (its ``KEY_FUNCTION`` does not put
    the ``KEY_PREFIX`` and the version on every key), so ``clear()``/``delete_pattern()``
    refuse to delete anything."""


# --- locks -----------------------------------------------------------------------------


class NotAnIntegerError(RedisPatternsError, _redis_exceptions.ResponseError, TypeError):
    """``incr``/``decr`` of a cache key whose value is not an integer.

    Also a ``TypeError`` (what Django's other cache backends and django-redis raise) and a
    ``redis.exceptions.ResponseError`` (what Django's own Redis backend raises), so code
    written for any of them catches it. Not a Redis outage: ``IGNORE_EXCEPTIONS`` does not
    swallow it.
    """


class LockError(RedisPatternsError):
    """Base class of lock errors."""


class LockNotAcquired(LockError):
    """The lock is held by someone else and could not be taken within ``wait`` seconds."""


class LockLost(LockError):
    """The lease ended or was taken over while the holder believed it still held the lock."""


class LockNotOwned(LockError):
    """``release()``/``extend()`` was called on a lock this instance does not hold."""


# --- rate limiting ---------------------------------------------------------------------


class RateLimited(RedisPatternsError):
    """Raised by programmatic callers that prefer an exception to checking a Decision."""

    def __init__(self, message: str = "rate limit exceeded", *, retry_after: float = 0.0,
                 limit: int = 0, remaining: int = 0) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit
        self.remaining = remaining


# --- idempotency -----------------------------------------------------------------------


class IdempotencyError(RedisPatternsError):
    """Base class of idempotency-key errors."""


class IdempotencyConflict(IdempotencyError):
    """A request with the same key is still being processed (HTTP 409).

    ``retry_after`` suggests when to try again (seconds); ``key_hash`` names the record.
    """

    def __init__(self, message: str = "a request with this key is in flight", *,
                 retry_after: int = 1, key_hash: str = "") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.key_hash = key_hash


class IdempotencyKeyReused(IdempotencyError):
    """The key was used before with a different request (HTTP 422).

    ``fields`` names what differs: any of ``"method"``, ``"path"``, ``"body"``.
    """

    def __init__(self, message: str = "idempotency key reused with a different request", *,
                 fields: tuple[str, ...] = (), key_hash: str = "") -> None:
        super().__init__(message)
        self.fields = fields
        self.key_hash = key_hash


class AlreadyEnqueued(IdempotencyError):
    """A task was already enqueued under this idempotency key and the framework cannot hand
    back its result; ``task_id`` is the first enqueue's result id (None while the first
    enqueue is still on its way)."""

    def __init__(self, message: str = "already enqueued with this idempotency key", *,
                 task_id: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id


class InvalidIdempotencyKey(IdempotencyError):
    """The key is empty, too long or contains control characters (HTTP 400)."""
