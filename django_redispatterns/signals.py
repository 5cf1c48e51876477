"""Django signals for the events operators care about.

Every signal is sent with ``sender`` = the class or module that decided, plus the
keyword arguments listed next to it. Receivers must be cheap: most are sent on the
request path.
"""

from __future__ import annotations

from django.dispatch import Signal

# Rate limiting: request, rule (str), decision (Decision), identity (hashed, str).
ratelimit_blocked = Signal()

# Idempotency: request, key_hash (str).
idempotent_replayed = Signal()
idempotency_conflict = Signal()  # a duplicate arrived while the first is in flight (409)
idempotency_mismatch = Signal()  # reused with another request (422); + fields (tuple[str, ...])

# Locks: name (str), token (str), fencing_token (int | None).
lock_acquired = Signal()
lock_lost = Signal()
lock_renew_failed = Signal()

# Cache: key (str).
stale_value_served = Signal()
stampede_wait = Signal()  # waited: bool outcome, seconds (float)
stampede_lease_takeover = Signal()  # a waiter took over after the computing caller's lease ended

# Sessions: user_id (str), count (int), kept (str | None).
sessions_revoked = Signal()
