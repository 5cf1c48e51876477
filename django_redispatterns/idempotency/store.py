"""The idempotency records of one connection: claim, complete, release, look up. No HTTP.

:class:`IdempotencyStore` takes the first-or-duplicate decision (one round trip: the claim
script also reads what holds the key), keeps a held claim's lease alive through
:mod:`.heartbeat`, and answers operators. The byte layout lives in :mod:`.records`, the
Redis calls in :mod:`.operations`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
from collections.abc import Iterable
from typing import Any

from .. import keys
from ..exceptions import IdempotencyConflict, IdempotencyKeyReused
from . import heartbeat, operations
from .records import (
    PENDING,
    Claim,
    Fingerprint,
    Record,
    StoredResponse,
    UnreadableRecord,
    decode_fingerprint,
    parse_value,
    pending_value,
)

logger = logging.getLogger("django_redispatterns.idempotency")

Outcome = Claim | StoredResponse

#: The longest a claim lives, renewals included, unless ``begin`` is told otherwise (seconds).
DEFAULT_MAX_LEASE = 600.0


class IdempotencyStore:
    """Idempotency records in Redis for one connection (a CACHES alias or a URL).

    Guarantees, for a given ``(scope, key)``:

    * at most one caller holds the claim while its lease lasts (one ``SET NX PX``);
    * a stored response is only written over *our* claim, and only once;
    * every key has a TTL: the lease while in flight, ``ttl`` once stored;
    * key names hold ``HMAC(scope, key)`` only — no raw key, no user id.
    """

    def __init__(self, connection_name: str) -> None:
        self.connection = connection_name

    # --- naming -------------------------------------------------------------------------

    @staticmethod
    def key_hash(scope: str, key: str) -> str:
        """The keyed digest naming ``key`` within ``scope`` (also what logs and signals show)."""
        return keys.identity_hash(f"{scope}\0{key}", purpose="idempotency")

    @classmethod
    def redis_key(cls, scope: str, key: str) -> tuple[str, str]:
        digest = cls.key_hash(scope, key)
        return operations.record_key(digest), digest

    # --- the request path ---------------------------------------------------------------

    def _claim_args(self, scope: str, key: str, fingerprint: Fingerprint, lease: float,
                    max_lease: float) -> Claim:
        redis_key, digest = self.redis_key(scope, key)
        pending = pending_value(_owner_token(), fingerprint)
        return Claim(redis_key, digest, pending, _ms(min(lease, max_lease)), self.connection)

    def begin(self, scope: str, key: str, fingerprint: Fingerprint, *, lease: float,
              max_lease: float = DEFAULT_MAX_LEASE) -> Outcome:
        """Claim ``key`` for a first run, or return the response stored for it.

        Returns a :class:`Claim` (run the view, then :meth:`complete` or :meth:`release`)
        or the :class:`StoredResponse` to replay. Raises :class:`IdempotencyConflict` while
        another holder's claim is live, :class:`IdempotencyKeyReused` (``.fields`` names the
        mismatch) for another request under the same key, :class:`BackendUnavailable` when
        Redis cannot answer. One round trip.

        A claim lives ``lease`` seconds and is renewed by this process until it is completed
        or released, but never past ``max_lease`` seconds from now.
        """
        claim = self._claim_args(scope, key, fingerprint, lease, max_lease)
        result = operations.claim(self.connection, claim.redis_key, claim.pending,
                                  claim.lease_ms)
        return self._decide(claim, fingerprint, result, max_lease)

    async def abegin(self, scope: str, key: str, fingerprint: Fingerprint, *, lease: float,
                     max_lease: float = DEFAULT_MAX_LEASE) -> Outcome:
        """Async twin of :meth:`begin` (``redis.asyncio``). Cancelled while the claim is on
        its way, it frees the claim (if it landed) from the heartbeat thread."""
        claim = self._claim_args(scope, key, fingerprint, lease, max_lease)
        try:
            result = await operations.aclaim(self.connection, claim.redis_key, claim.pending,
                                             claim.lease_ms)
        except asyncio.CancelledError:
            heartbeat.release_later(claim)
            raise
        return self._decide(claim, fingerprint, result, max_lease)

    def _decide(self, claim: Claim, fingerprint: Fingerprint, result: Any,
                max_lease: float = DEFAULT_MAX_LEASE) -> Outcome:
        if result == 1 or result == claim.pending:
            # Taken now, or by our own earlier send of this very call (a re-sent claim).
            heartbeat.watch(claim, max_lease)
            return claim
        if isinstance(result, list):  # a value we did not write, or another Redis type
            raise _unreadable(claim, "not a record we wrote",
                              retry_after=max(1, result[1] // 1000))
        try:
            kind, stored_fp, response = parse_value(result)
            fields = ([] if stored_fp == fingerprint.encoded  # the same request: the usual case
                      else decode_fingerprint(stored_fp).mismatch(fingerprint))
        except UnreadableRecord as exc:  # ours, but truncated or damaged
            raise _unreadable(claim, str(exc), retry_after=1) from None
        if fields:
            raise IdempotencyKeyReused(
                f"idempotency key reused with a different {', '.join(fields)}",
                fields=tuple(fields), key_hash=claim.key_hash)
        if kind == PENDING:
            raise _conflict(claim, retry_after=1, why="a request with this key is in flight")
        assert response is not None
        return response

    def complete(self, claim: Claim, response: StoredResponse, fingerprint: Fingerprint, *,
                 ttl: float) -> bool:
        """Store ``response`` in place of ``claim`` for ``ttl`` seconds, if the claim is still ours.

        Returns False when the claim was lost (lease ended and someone else took the key, or an
        operator deleted it); the response is then not stored. Raises ``redis.RedisError``.
        """
        value = response.encode(fingerprint)
        heartbeat.unwatch(claim)
        return operations.complete(self.connection, claim.redis_key, claim.pending, value,
                                   _ms(ttl))

    async def acomplete(self, claim: Claim, response: StoredResponse, fingerprint: Fingerprint,
                        *, ttl: float) -> bool:
        """Async twin of :meth:`complete`."""
        value = response.encode(fingerprint)
        heartbeat.unwatch(claim)
        return await operations.acomplete(self.connection, claim.redis_key, claim.pending,
                                          value, _ms(ttl))

    def release(self, claim: Claim) -> bool:
        """Free the key so a retry runs again (only if the claim is still ours)."""
        heartbeat.unwatch(claim)
        return operations.release(self.connection, claim.redis_key, claim.pending)

    async def arelease(self, claim: Claim) -> bool:
        """Async twin of :meth:`release`."""
        heartbeat.unwatch(claim)
        return await operations.arelease(self.connection, claim.redis_key, claim.pending)

    # --- operators ----------------------------------------------------------------------

    def lookup(self, scope: str, key: str) -> Record | None:
        """The record for ``(scope, key)``, or None. Unreadable values come back with
        ``state="unreadable"``."""
        redis_key, digest = self.redis_key(scope, key)
        value, pttl = operations.read(self.connection, redis_key)
        if value is None:
            return None
        try:
            kind, encoded, response = parse_value(value)
            fp = decode_fingerprint(encoded)
        except UnreadableRecord as exc:
            return Record(digest, redis_key, "unreadable", pttl, None,
                          extra={"error": str(exc), "size": len(value)})
        state = "in_flight" if kind == PENDING else "stored"
        return Record(digest, redis_key, state, pttl, fp, response)

    def delete(self, scope: str, key: str) -> bool:
        """Delete the record (stored or in flight): the next request with the key runs anew."""
        return operations.delete(self.connection, self.redis_key(scope, key)[0])

    def scan(self, count: int = 500) -> Iterable[bytes]:
        """Every idempotency key name under this app's prefix (SCAN, never KEYS)."""
        return operations.scan(self.connection, count)


def _new_process_prefix() -> None:
    global _process_prefix
    _process_prefix = secrets.token_hex(8)


_process_prefix = ""
_new_process_prefix()
os.register_at_fork(after_in_child=_new_process_prefix)
_claims_taken = itertools.count()


def _owner_token() -> str:
    """Unique to one claim: a random prefix per process (new after a fork) and a counter.

    Owner tokens tell our claim from a later holder's; they need to be unique, not secret
    (only who can write to Redis could misuse one), so no system call per request.
    """
    return f"{_process_prefix}{next(_claims_taken):x}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _unreadable(claim: Claim, why: str, *, retry_after: int) -> IdempotencyConflict:
    logger.error("idempotency record %s is unreadable (%s); answering 409 until it expires or "
                 "an operator deletes it", claim.key_hash[:12], why)
    return _conflict(claim, retry_after=retry_after, why="the stored record is unreadable")


def _conflict(claim: Claim, *, retry_after: int, why: str) -> IdempotencyConflict:
    return IdempotencyConflict(why, retry_after=retry_after, key_hash=claim.key_hash)
