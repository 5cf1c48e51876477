"""Single-flight ``get_or_set``, written once as a generator and driven sync or async.

The generator decides; the driver in :mod:`.flight` talks to Redis (through :mod:`.ops` /
:mod:`.aops`). It reads and writes values through a :class:`~.codec.Codec` and reports
through :class:`Reporter`, so it needs nothing of the backend. It yields operations and
receives their results:

* ``("claim", keys, args)`` → the reply of ``lua/cache_claim.lua``;
* ``("wait", wake_key, seconds)`` → ``True`` when the computing caller woke us;
* ``("compute", renew)`` → the callable's value (its exception is thrown into the
  generator); ``renew`` is the ``("renew", keys, args)`` operation
  (``lua/cache_renew.lua``) that keeps our claim alive while the callable runs, or
  ``None`` when we compute without holding the claim;
* ``("settle", keys, args)`` → ``lua/cache_settle.lua`` (store and/or release, wake waiters).

The generator's return value is ``get_or_set``'s result.

Time. A claim is short (``Policy.claim_lease``, a few socket timeouts) and carries the
server's clock: the computing caller extends it while it computes (never past
``STAMPEDE_LEASE`` from the claim), so a claim whose caller gave up, crashed, or came back
with a restarted server blocks others for one short lease at most. The store counts the
value's lifetime from when it was computed, on the server's clock, so a store that waited
in a hung server's socket gets only what is left of it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .. import signals
from . import envelope, meta
from .codec import MISSING, Codec
from .options import Policy

logger = logging.getLogger("django_redispatterns.cache")

Op = tuple[Any, ...]
Seen = tuple[bytes, Any]  # a value's bytes and its metadata record (or None)
Flow = Generator[Op, Any, Any]

# Wake-up lists outlive the settle by this long, so a waiter that checked the lock just
# before the holder settled still finds the element when it starts blocking.
WAKE_TTL_MS = 5000
_TOKEN_BYTES = 12  # 16 URL-safe characters: every token has the same length


class Reporter:
    """The cache signals of one backend (``cache`` is the backend instance the receivers
    get; it is only passed on)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def stale_served(self, key: Any) -> None:
        signals.stale_value_served.send(type(self.cache), key=key, cache=self.cache)

    def takeover(self, key: Any) -> None:
        logger.warning("cache key %r: computing caller's lease ended; taking over", key)
        signals.stampede_lease_takeover.send(type(self.cache), key=key, cache=self.cache)

    def waited(self, key: Any, since: float | None, *, got_value: bool) -> None:
        """Send ``stampede_wait`` for a caller that waited since ``since`` (monotonic)."""
        if since is None:
            return
        seconds = time.monotonic() - since
        signals.stampede_wait.send(type(self.cache), key=key, cache=self.cache,
                                   waited=got_value, seconds=seconds)


@dataclass(frozen=True)
class ClaimTime:
    """When a claim ran: the server's clock (ms) and this process's monotonic clock."""

    server_ms: int
    local: float

    def elapsed_ms(self) -> int:
        """Milliseconds since the claim's reply arrived here."""
        return max(0, int((time.monotonic() - self.local) * 1000))


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def get_or_set_flow(
    codec: Codec, report: Reporter, key: Any, ttl: float | None, nkey: str, policy: Policy,
    seen: Seen | None, waited: float = 0.0,
) -> Flow:
    """Return the cached value of ``nkey`` or the callable's, computing it at most once
    per expiry across every thread and process (see docs/cache.md for the guarantees).

    ``seen`` is what the caller's own read returned, the value's bytes and its metadata
    record (``None``: a miss; else an entry that is stale or that XFetch picked for an
    early refresh); ``waited`` the seconds it already
    spent waiting for another caller (counts against STAMPEDE_WAIT). ``ttl`` > 0 or None.
    """
    stale: envelope.Entry | None = None
    if seen is not None:
        found = codec.decode(*seen)  # MISSING (undecodable): as a miss; see the claim below
        if found is not MISSING and not isinstance(found, envelope.Entry):
            return found  # written by set(): a plain hit
        now = time.time()
        # The second XFetch draw for this read (the hit path made the first): an early
        # refresh happens with probability exp(-2(expiry - now) / (δβ)); docs/cache.md.
        if isinstance(found, envelope.Entry):
            if not found.is_stale(now) and not found.refresh_early(now, policy.beta):
                return found.value
            stale = found

    lock_key = codec.companion(nkey, "lock")
    meta_key = codec.meta_key(nkey)
    token = new_token()
    claim_ms = max(1, int(policy.claim_lease * 1000))
    waited_since: float | None = time.monotonic() - waited if waited else None
    holder_seen: str | None = None
    woken = False
    while True:
        # An entry we may serve while another caller refreshes it: fresh (an early
        # refresh) or expired less than STALE_TTL ago. Otherwise we wait like a miss.
        servable = stale is not None and stale.servable(time.time(), policy.stale_ttl)
        reply = yield (
            "claim",
            (nkey, lock_key, meta_key),
            (token, claim_ms, stale.header if stale is not None else b"",
             "0" if servable else "1"),
        )
        status, claimed = int(reply[0]), ClaimTime(int(reply[1]), time.monotonic())
        if status == 2:  # a value is there (filled while we looked, or refreshed by another)
            found = codec.decode(reply[2], reply[3] if len(reply) > 3 else None)
            if found is MISSING:  # undecodable: compute, and our store replaces it
                return (yield from _compute_and_store(codec, nkey, lock_key, token, ttl,
                                                      policy, claimed, holding=False))
            if not isinstance(found, envelope.Entry) or not found.is_stale(time.time()):
                report.waited(key, waited_since, got_value=True)
                return found.value if isinstance(found, envelope.Entry) else found
            stale = found  # an expired value (kept for STALE_TTL): refresh it
            continue
        if status == 1:
            if holder_seen is not None and not woken:
                report.takeover(key)
            break
        holder, pttl_ms = reply[2], int(reply[3])
        holder = holder.decode() if isinstance(holder, bytes) else str(holder)
        if servable and stale is not None:  # another caller refreshes: serve ours, at once
            if stale.is_stale(time.time()):  # (not for an early refresh of a fresh value)
                report.stale_served(key)
            return stale.value
        if waited_since is None:
            waited_since = time.monotonic()
        remaining = policy.max_wait - (time.monotonic() - waited_since)
        if remaining <= 0:
            logger.warning(
                "cache key %r: waited %.1fs for the computing caller; computing too",
                key, policy.max_wait,
            )
            report.waited(key, waited_since, got_value=False)
            return (yield from _compute_and_store(codec, nkey, lock_key, token, ttl, policy,
                                                  claimed, holding=False))
        # Block on the holder's wake-up list until it settles or its claim ends; no polling.
        seconds = min(max(pttl_ms, 0) / 1000 + 0.01, remaining, policy.block_cap)
        wake_key = codec.companion(nkey, f"wake:{holder}")
        woken = bool((yield ("wait", wake_key, max(seconds, 0.01))))
        holder_seen = holder

    report.waited(key, waited_since, got_value=False)
    return (yield from _compute_and_store(codec, nkey, lock_key, token, ttl, policy, claimed,
                                          holding=True))


def _compute_and_store(
    codec: Codec, nkey: str, lock_key: str, token: str, ttl: float | None, policy: Policy,
    claimed: ClaimTime, *, holding: bool,
) -> Flow:
    keys = (nkey, lock_key, codec.companion(nkey, f"wake:{token}"), codec.meta_key(nkey))
    renew = None
    if holding:
        renew = ("renew", (nkey, lock_key),
                 (token, max(1, int(policy.claim_lease * 1000)), claimed.server_ms,
                  max(1, int(policy.lease * 1000))))
    started = time.perf_counter()
    try:
        value = yield ("compute", renew)
    except BaseException:
        # Release at once (not at the end of the claim) and wake the waiters: one of them
        # computes next. The exception goes to this caller only.
        yield ("settle", keys, (token, "0", b"", 0, WAKE_TTL_MS, 0, 0, b""))
        raise
    delta = time.perf_counter() - started
    # Exactly what django-redis's set() stores, so any process of the fleet reads it;
    # XFetch's and STALE_TTL's metadata goes to its companion key.
    payload = codec.encode_plain(value)
    record = meta.pack(meta.stored_bytes(payload), ttl, delta)
    hard_ms = 0 if ttl is None else max(1, int((ttl + policy.stale_ttl) * 1000))
    yield ("settle", keys, (token, "1", payload, hard_ms, WAKE_TTL_MS, claimed.server_ms,
                            claimed.elapsed_ms(), record))
    return value
