"""Lease renewal for claims held while a view runs: one daemon thread per process.

A claim is watched from the moment it is taken until it is stored or freed. The thread
sleeps on a condition variable until the earliest claim is a third of its lease old (no
polling of Redis), then renews each due claim with the owner-checked
``lua/idempotency_extend.lua``. A view that finishes within a third of its lease never
costs a renewal. Renewal uses the sync client for the claim's connection, so it serves
sync and async views alike and keeps running while an event loop is busy.

**The bound.** A claim is never renewed past its *maximum lease*, counted from when it
was taken (``MAX_LEASE``): the last renewal sets a TTL that ends there, and the claim is
then no longer watched. A view still running at that point loses its claim (a warning
says so), so a stuck worker can hold a key for ``MAX_LEASE`` at most.

A renewal that finds the claim gone (the lease ran out during a pause, or an operator
deleted it) logs a warning: a duplicate may now run (at most once only while the lease
holds; at least once after it).

The thread also frees the claims handed to :func:`release_later`: those of requests that
ended where no Redis call can be made or awaited (a cancelled task, a response dropped
without being rendered, found by the garbage collector).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import redis

from . import operations

if TYPE_CHECKING:
    from .records import Claim

logger = logging.getLogger("django_redispatterns.idempotency")
T = TypeVar("T")

#: With no claim due sooner, the thread looks at its list this often (seconds). Taking a
#: claim due later than that wakes nobody: the hot path costs a dict insert, no thread switch.
IDLE_TICK = 2.0


@dataclass
class _Watched:
    claim: Claim
    due: float  # the next renewal (monotonic clock)
    until: float  # the end of the claim's life: when it was taken + its maximum lease


class Heartbeat:
    """Renews the leases of the claims this process holds, within their maximum lease.

    Taking and settling a claim cost one dict store or pop each (atomic): no lock and no
    thread switch on the request path. The thread snapshots the dict when it wakes; it is
    woken only when a new claim is due before the time it was going to look anyway.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also in a forked child: the parent's thread and claims are not ours.
        self._cond = threading.Condition()
        self._watched: dict[int, _Watched] = {}
        self._to_release: list[Claim] = []
        self._wake_at = 0.0  # when the thread will look again on its own (monotonic)
        self._thread: threading.Thread | None = None

    def watch(self, claim: Claim, max_lease: float) -> None:
        """Renew ``claim`` until :meth:`unwatch`, for ``max_lease`` seconds from now at most."""
        now = time.monotonic()
        entry = _Watched(claim, now + claim.lease_ms / 3000, now + max_lease)
        self._watched[id(claim)] = entry
        if self._thread is None:
            self._start()
        elif entry.due < self._wake_at:  # due before the thread looks: wake it
            with self._cond:
                self._cond.notify()

    def unwatch(self, claim: Claim) -> None:
        self._watched.pop(id(claim), None)

    def release_later(self, claim: Claim) -> None:
        """Stop renewing ``claim`` and free it from the heartbeat thread, soon (owner-checked:
        a claim already stored or taken over is left alone)."""
        self._watched.pop(id(claim), None)
        with self._cond:
            self._to_release.append(claim)
            self._cond.notify()
        if self._thread is None:
            self._start()

    def watching(self, claim: Claim) -> bool:
        return id(claim) in self._watched

    def watched_keys(self) -> set[str]:
        """The record keys this process renews now."""
        return {entry.claim.redis_key for entry in list(self._watched.values())}

    def _start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redispatterns-idempotency-heartbeat", daemon=True)
                self._thread.start()

    def _next(self) -> tuple[list[_Watched], list[Claim]]:
        """Block until some claim is due or handed over; return them (next due times set)."""
        with self._cond:
            while True:
                now = time.monotonic()
                # Set before the snapshot: a claim taken after it sees a wake-up time no
                # later than the one computed below, and notifies if it is due sooner.
                self._wake_at = now + IDLE_TICK
                releases, self._to_release = self._to_release, []
                entries = list(self._watched.values())
                due = [e for e in entries if e.due <= now]
                if due or releases:
                    self._wake_at = now  # busy: the next look comes right after this batch
                    for entry in due:
                        entry.due = now + entry.claim.lease_ms / 3000
                    return due, releases
                self._wake_at = min((e.due for e in entries), default=self._wake_at)
                self._cond.wait(self._wake_at - now)

    def _run(self) -> None:
        while True:
            due, releases = self._next()
            for claim in releases:
                _quietly(self._release, claim)
            for entry in due:
                _quietly(self._renew, entry)

    def _renew(self, entry: _Watched) -> None:
        claim = entry.claim
        if not self.watching(claim):  # settled since it was found due
            return
        left_ms = int((entry.until - time.monotonic()) * 1000)
        last = left_ms <= claim.lease_ms  # this renewal ends the claim at its maximum lease
        if last:
            self.unwatch(claim)
            logger.warning("idempotency claim %s reached its maximum lease while its view still "
                           "ran; it ends in %.1f s and a retry may then run the view again",
                           claim.key_hash[:12], max(0, left_ms) / 1000)
            if left_ms <= 0:
                return
        try:
            renewed = operations.extend(claim.connection, claim.redis_key, claim.pending,
                                        min(claim.lease_ms, left_ms))
        except redis.RedisError as exc:
            logger.warning("could not renew idempotency claim %s: %s (retrying at the next "
                           "beat; the lease ends if Redis stays away)", claim.key_hash[:12], exc)
            return
        if not renewed and (last or self.watching(claim)):
            self.unwatch(claim)
            logger.warning("idempotency claim %s was lost while its view ran (lease ended or "
                           "deleted); a duplicate request may run the view again",
                           claim.key_hash[:12])

    @staticmethod
    def _release(claim: Claim) -> None:
        try:
            operations.release(claim.connection, claim.redis_key, claim.pending)
        except redis.RedisError as exc:
            logger.warning("idempotency: could not free %s (%s); its lease ends in %.0f s",
                           claim.key_hash[:12], exc, claim.lease_ms / 1000)


def _quietly(work: Callable[[T], None], item: T) -> None:
    """One claim's failure never stops the other claims' renewals."""
    try:
        work(item)
    except Exception:
        logger.exception("idempotency: the heartbeat failed on one claim")


_heartbeat = Heartbeat()
watch = _heartbeat.watch
unwatch = _heartbeat.unwatch
release_later = _heartbeat.release_later
watching = _heartbeat.watching
watched_keys = _heartbeat.watched_keys
