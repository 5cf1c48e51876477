"""The metrics (in ``prometheus_client``'s default registry) and the receivers that feed them.

Each receiver does one label lookup and one increment or observation. Labels come only from
values the app itself bounds: a rate-limit rule's name ("group rate algorithm"), fixed
outcome words and the idempotency problem codes. Identities, keys, session ids and lock
names (which often carry ids) never become labels.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal

try:
    from prometheus_client import Counter, Histogram
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "django_redispatterns.contrib.metrics needs prometheus-client: "
        'pip install "django-redispatterns[metrics]"') from exc

from django_redispatterns import signals

__all__ = ["METRICS", "connect", "disconnect"]

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

RATELIMIT_DECISIONS = Counter(
    "redispatterns_ratelimit_decisions",
    "Rate-limit decisions by rule and outcome (allowed, blocked, would_block for a shadow "
    "rule, undecided when Redis could not answer).",
    ["rule", "outcome"],
)
RATELIMIT_UNAVAILABLE = Counter(
    "redispatterns_ratelimit_unavailable",
    "Requests whose rate limits Redis could not decide: fail_open (let through) or "
    "fail_closed (503).",
    ["outcome"],
)
IDEMPOTENCY = Counter(
    "redispatterns_idempotency_requests",
    "Requests with an idempotency key by outcome: stored, replayed, conflict (409), "
    "mismatch (422), key_missing / key_invalid / scope_missing (400), unavailable (503).",
    ["outcome"],
)
CACHE_STALE = Counter(
    "redispatterns_cache_stale_served", "Stale cache values served while one caller recomputes.")
CACHE_WAIT = Histogram(
    "redispatterns_cache_stampede_wait_seconds",
    "Time cache callers waited for another caller's computation: outcome value (it arrived) "
    "or gave_up (the wait ran out or the lease ended).",
    ["outcome"], buckets=WAIT_BUCKETS,
)
CACHE_TAKEOVER = Counter(
    "redispatterns_cache_lease_takeovers",
    "Waiters that took over a computation after the computing caller's lease ended.")
LOCK_ACQUIRED = Counter("redispatterns_lock_acquired", "Locks acquired.")
LOCK_WAIT = Histogram(
    "redispatterns_lock_wait_seconds",
    "Time acquires waited for a held lock: outcome acquired or timed_out.",
    ["outcome"], buckets=WAIT_BUCKETS,
)
LOCK_LOST = Counter("redispatterns_lock_lost", "Locks lost while held (lease ended, taken over).")
LOCK_RENEW_FAILED = Counter(
    "redispatterns_lock_renew_failed", "Lock renewals that failed (Redis unreachable or lost).")
SESSIONS_REVOKED = Counter(
    "redispatterns_sessions_revoked",
    "Sessions ended by log-out-everywhere or by ending one device.")
SESSION_REVOCATIONS = Counter(
    "redispatterns_session_revocations",
    "logout_everywhere calls (whatever they ended) and revoke_session calls that ended one.")

METRICS = (RATELIMIT_DECISIONS, RATELIMIT_UNAVAILABLE, IDEMPOTENCY, CACHE_STALE, CACHE_WAIT,
           CACHE_TAKEOVER, LOCK_ACQUIRED, LOCK_WAIT, LOCK_LOST, LOCK_RENEW_FAILED,
           SESSIONS_REVOKED, SESSION_REVOCATIONS)

# Pre-bound children of the fixed-outcome metrics (one dict lookup per event).
_IDEMPOTENCY_STORED = IDEMPOTENCY.labels("stored")
_IDEMPOTENCY_REPLAYED = IDEMPOTENCY.labels("replayed")
_IDEMPOTENCY_CONFLICT = IDEMPOTENCY.labels("conflict")
_IDEMPOTENCY_MISMATCH = IDEMPOTENCY.labels("mismatch")
_IDEMPOTENCY_UNAVAILABLE = IDEMPOTENCY.labels("unavailable")
_INVALID_CODES = {code: IDEMPOTENCY.labels(code.removeprefix("idempotency_"))
                  for code in ("idempotency_key_missing", "idempotency_key_invalid",
                               "idempotency_scope_missing")}
_INVALID_OTHER = IDEMPOTENCY.labels("invalid")


def _decided(rule: str = "", decision: Any = None, shadow: bool = False, **_: Any) -> None:
    if decision is None or not decision.decided:
        outcome = "undecided"
    elif decision.allowed:
        outcome = "allowed"
    else:
        outcome = "would_block" if shadow else "blocked"
    RATELIMIT_DECISIONS.labels(rule, outcome).inc()


def _unavailable(failed_open: bool = True, **_: Any) -> None:
    RATELIMIT_UNAVAILABLE.labels("fail_open" if failed_open else "fail_closed").inc()


def _invalid(code: str = "", **_: Any) -> None:
    _INVALID_CODES.get(code, _INVALID_OTHER).inc()


def _stampede_wait(waited: bool = False, seconds: float = 0.0, **_: Any) -> None:
    CACHE_WAIT.labels("value" if waited else "gave_up").observe(seconds)


def _lock_waited(acquired: bool = False, seconds: float = 0.0, **_: Any) -> None:
    LOCK_WAIT.labels("acquired" if acquired else "timed_out").observe(seconds)


def _revoked(count: int = 0, **_: Any) -> None:
    SESSION_REVOCATIONS.inc()
    if count:
        SESSIONS_REVOKED.inc(count)


def _counter(child: Any) -> Any:
    def receiver(**_: Any) -> None:
        child.inc()
    return receiver


RECEIVERS: tuple[tuple[Signal, Any], ...] = (
    (signals.ratelimit_decided, _decided),
    (signals.ratelimit_unavailable, _unavailable),
    (signals.idempotency_stored, _counter(_IDEMPOTENCY_STORED)),
    (signals.idempotent_replayed, _counter(_IDEMPOTENCY_REPLAYED)),
    (signals.idempotency_conflict, _counter(_IDEMPOTENCY_CONFLICT)),
    (signals.idempotency_mismatch, _counter(_IDEMPOTENCY_MISMATCH)),
    (signals.idempotency_invalid, _invalid),
    (signals.idempotency_unavailable, _counter(_IDEMPOTENCY_UNAVAILABLE)),
    (signals.stale_value_served, _counter(CACHE_STALE)),
    (signals.stampede_wait, _stampede_wait),
    (signals.stampede_lease_takeover, _counter(CACHE_TAKEOVER)),
    (signals.lock_acquired, _counter(LOCK_ACQUIRED)),
    (signals.lock_waited, _lock_waited),
    (signals.lock_lost, _counter(LOCK_LOST)),
    (signals.lock_renew_failed, _counter(LOCK_RENEW_FAILED)),
    (signals.sessions_revoked, _revoked),
)


def _uid(index: int) -> str:
    return f"django_redispatterns.contrib.metrics:{index}"


def connect() -> None:
    """Connect every receiver (strong references; connecting twice changes nothing)."""
    for i, (signal, receiver) in enumerate(RECEIVERS):
        signal.connect(receiver, weak=False, dispatch_uid=_uid(i))


def disconnect() -> None:
    """Disconnect every receiver (the metrics stay registered, with their values)."""
    for i, (signal, _) in enumerate(RECEIVERS):
        signal.disconnect(dispatch_uid=_uid(i))
