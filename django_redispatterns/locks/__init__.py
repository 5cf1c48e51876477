"""Distributed locks: leased, owner-checked, fenced; and the command decorators.

::

    from django_redispatterns.locks import Lock, MultiLock, locked, single_flight

    with Lock("nightly-report", ttl=30) as lock:
        write_report(fence=lock.fencing_token)

See ``docs/locks.md`` for the guarantees and their limits.
"""

from __future__ import annotations

from ..exceptions import LockLost, LockNotAcquired, LockNotOwned
from ._decorators import current_lock, locked, single_flight
from ._fencing import fenced_update
from ._lock import Lock, MultiLock
from ._names import DEFAULT_NAMESPACE, fence_key, held_key

__all__ = [
    "DEFAULT_NAMESPACE",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MultiLock",
    "current_lock",
    "fence_key",
    "fenced_update",
    "held_key",
    "locked",
    "single_flight",
]
