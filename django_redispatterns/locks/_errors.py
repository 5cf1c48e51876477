"""The exceptions a lock raises, each naming the lock and what went wrong."""

from __future__ import annotations

import logging

from ..exceptions import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned

logger = logging.getLogger("django_redispatterns.locks")


def _named(error: Exception, label: str) -> Exception:
    error.name = label  # type: ignore[attr-defined]
    return error


def unavailable(label: str, action: str, exc: BaseException) -> BackendUnavailable:
    """Redis could not be reached for ``action`` (logged once here)."""
    logger.error("lock %r: Redis unavailable during %s: %s", label, action, exc)
    return BackendUnavailable(f"could not {action} lock {label!r}: Redis unavailable "
                              f"({type(exc).__name__}: {exc})")


def lost(label: str, reason: str | None) -> LockLost:
    """The lease ended (or was taken over) while held."""
    error = LockLost(f"lock {label!r} was lost while held: {reason}")
    _named(error, label)
    return error


def not_owned(label: str, action: str) -> LockNotOwned:
    """``action`` (release, extend) on a lock this instance does not hold."""
    error = LockNotOwned(f"cannot {action} lock {label!r}: this instance does not "
                         "hold it (never acquired, already released, or the lease ended "
                         "and another owner may hold it now)")
    _named(error, label)
    return error


def not_acquired(label: str, wait: float) -> LockNotAcquired:
    """Another owner still held the lock when the wait ran out."""
    error = LockNotAcquired(f"lock {label!r} is held by another owner; gave up after "
                            f"waiting {wait:g}s")
    _named(error, label)
    return error
