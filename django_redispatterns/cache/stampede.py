"""Single-flight ``get_or_set``, written once as a generator and driven sync or async.

The generator decides; the drivers in :mod:`.flight` talk to Redis (through
:mod:`.ops` / :mod:`.aops`). It reads and writes values through a :class:`~.codec.Codec`
and reports through :class:`Reporter`, so it needs nothing of the backend. It yields
operations and receives their results:

* ``("read", key)`` → the raw bytes or ``None`` (one GET: the hit path);
* ``("claim", keys, args)`` → the reply of ``lua/cache_claim.lua``;
* ``("wait", wake_key, seconds)`` → ``True`` when the computing caller woke us;
* ``("compute",)`` → the callable's value (its exception is thrown into the generator);
* ``("settle", keys, args)`` → ``lua/cache_settle.lua`` (store and/or release, wake waiters).

The generator's return value is ``get_or_set``'s result.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Generator
from typing import Any

from .. import signals
from . import envelope
from .codec import Codec
from .options import Policy

logger = logging.getLogger("django_redispatterns.cache")

Op = tuple[Any, ...]
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


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


UNREAD = object()


def get_or_set_flow(
    codec: Codec, report: Reporter, key: Any, ttl: float | None, nkey: str, policy: Policy,
    raw: Any = UNREAD, waited: float = 0.0,
) -> Flow:
    """Return the cached value of ``nkey`` or the callable's, computing it at most once
    per expiry across every thread and process (see docs/cache.md for the guarantees).

    ``raw`` is what the caller's own GET returned, if it already read the key; ``waited``
    the seconds it already spent waiting for another caller (counts against STAMPEDE_WAIT).
    """
    if ttl is not None and ttl <= 0:  # Django: a timeout <= 0 stores nothing
        return (yield ("compute",))

    stale: envelope.Entry | None = None
    if raw is UNREAD:
        raw = yield ("read", nkey)
    if raw is not None:
        found = codec.decode(raw)
        if not isinstance(found, envelope.Entry):
            return found  # written by set(): a plain hit
        now = time.time()
        if not found.is_stale(now) and not found.refresh_early(now, policy.beta):
            return found.value
        stale = found

    lock_key = codec.companion(nkey, "lock")
    token = new_token()
    lease_ms = max(1, int(policy.lease * 1000))
    waited_since: float | None = time.monotonic() - waited if waited else None
    holder_seen: str | None = None
    woken = False
    while True:
        header = stale.header if stale is not None else b""
        reply = yield (
            "claim",
            (nkey, lock_key),
            (token, lease_ms, header, "0" if stale is not None else "1"),
        )
        status = int(reply[0])
        if status == 2:  # a value is there (filled while we looked, or refreshed by another)
            found = codec.decode(reply[1])
            if not isinstance(found, envelope.Entry) or not found.is_stale(time.time()):
                report.waited(key, waited_since, got_value=True)
                return found.value if isinstance(found, envelope.Entry) else found
            stale = found  # an expired value still inside STALE_TTL: refresh it
            continue
        if status == 1:
            if holder_seen is not None and not woken:
                report.takeover(key)
            break
        holder, pttl_ms = reply[1], int(reply[2])
        holder = holder.decode() if isinstance(holder, bytes) else str(holder)
        if stale is not None:  # another caller refreshes: serve what we have, at once
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
            return (yield from _compute_and_store(codec, nkey, lock_key, token, ttl, policy))
        # Block on the holder's wake-up list until it settles or its lease ends; no polling.
        seconds = min(max(pttl_ms, 0) / 1000 + 0.01, remaining, policy.block_cap)
        wake_key = codec.companion(nkey, f"wake:{holder}")
        woken = bool((yield ("wait", wake_key, max(seconds, 0.01))))
        holder_seen = holder

    report.waited(key, waited_since, got_value=False)
    return (yield from _compute_and_store(codec, nkey, lock_key, token, ttl, policy))


def _compute_and_store(
    codec: Codec, nkey: str, lock_key: str, token: str, ttl: float | None, policy: Policy
) -> Flow:
    keys = (nkey, lock_key, codec.companion(nkey, f"wake:{token}"))
    started = time.perf_counter()
    try:
        value = yield ("compute",)
    except BaseException:
        # Release at once (not at the end of the lease) and wake the waiters: one of them
        # computes next. The exception goes to this caller only.
        yield ("settle", keys, (token, "0", b"", 0, WAKE_TTL_MS))
        raise
    delta = time.perf_counter() - started
    payload = envelope.pack(codec.encode(value), ttl, delta)
    hard_ms = 0 if ttl is None else max(1, int((ttl + policy.stale_ttl) * 1000))
    yield ("settle", keys, (token, "1", payload, hard_ms, WAKE_TTL_MS))
    return value
