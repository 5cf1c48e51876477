"""Django signals for the events operators care about.

Every signal is sent with ``sender`` = the class or module that decided, plus the
keyword arguments listed next to it. Receivers must be cheap: most are sent on the
request path. Signals sent on every request (``ratelimit_decided``) are only sent when
something is connected to them. ``django_redispatterns.contrib.metrics`` turns them all
into Prometheus metrics (docs/metrics.md).
"""

from __future__ import annotations

from django.dispatch import Signal

# Rate limiting: request, rule (str), decision (Decision), identity (hashed, str), shadow (bool).
ratelimit_blocked = Signal()
# Every decision of a rule, allowed or not (sent only when a receiver is connected):
# request, rule (str), decision (Decision; ``decided`` False when Redis could not answer),
# shadow (bool).
ratelimit_decided = Signal()
# Redis could not decide: request, rules (tuple[str, ...]), failed_open (bool: let through
# by FAIL_OPEN, or only shadow rules applied; False: answered 503).
ratelimit_unavailable = Signal()

# Idempotency: request, key_hash (str).
idempotent_replayed = Signal()
idempotency_conflict = Signal()  # a duplicate arrived while the first is in flight (409)
idempotency_mismatch = Signal()  # reused with another request (422); + fields (tuple[str, ...])
idempotency_stored = Signal()  # the view's response was stored for replay; + status (int)
idempotency_invalid = Signal()  # answered 400: request, code (str: the problem's code)
idempotency_unavailable = Signal()  # Redis could not answer, 503: request

# Locks: name (str), token (str), fencing_token (int | None).
lock_acquired = Signal()
lock_lost = Signal()
lock_renew_failed = Signal()
# An acquire that found the lock held: name (str), seconds (float, how long it waited),
# acquired (bool: False when its wait ran out, or it had none).
lock_waited = Signal()

# Cache: key (str).
stale_value_served = Signal()
stampede_wait = Signal()  # waited: bool outcome, seconds (float)
stampede_lease_takeover = Signal()  # a waiter took over after the computing caller's lease ended

# Sessions: user_id (str), count (int), kept (str | None).
sessions_revoked = Signal()
