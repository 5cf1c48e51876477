"""Lease renewal for long views: one daemon thread per process, not one per request.

A claim is watched from the moment it is taken until it is completed or released. The
thread sleeps on a condition variable until the earliest claim is a third of its lease old
(no polling of Redis), then renews each due claim with the owner-checked
``lua/idempotency_extend.lua``. A view that finishes within a third of its lease never
costs a renewal. Renewal uses the sync client for the claim's connection, so it serves
sync and async views alike and keeps running while an event loop is busy.

A renewal that finds the claim gone (the lease ran out during a pause, or an operator
deleted it) logs a warning: a duplicate may now run (at most once only while the lease
holds; at least once after it). Renewal stops after ``MAX_RENEW_SECONDS`` so a view stuck forever cannot hold a key
forever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from . import operations

if TYPE_CHECKING:
    from .records import Claim

logger = logging.getLogger("django_redispatterns.idempotency")

MAX_RENEW_SECONDS = 24 * 3600


@dataclass
class _Watched:
    claim: Claim
    due: float
    until: float


class Heartbeat:
    """Renews the leases of the claims this process holds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: dict[int, _Watched] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def watch(self, claim: Claim) -> None:
        now = time.monotonic()
        entry = _Watched(claim, now + claim.lease_ms / 3000, now + MAX_RENEW_SECONDS)
        with self._cond:
            self._ensure_thread()
            self._watched[id(claim)] = entry
            if len(self._watched) == 1:
                self._cond.notify()

    def unwatch(self, claim: Claim) -> None:
        with self._cond:
            self._watched.pop(id(claim), None)

    def watching(self, claim: Claim) -> bool:
        with self._cond:
            return id(claim) in self._watched

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread and claims are not ours
            self._watched.clear()
            self._thread = None
            self._pid = os.getpid()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="redispatterns-idempotency-heartbeat", daemon=True)
            self._thread.start()

    def _due(self) -> list[_Watched]:
        """Block until some claim is due; return those (their next due time already set)."""
        with self._cond:
            while True:
                now = time.monotonic()
                for key in [k for k, e in self._watched.items() if e.until <= now]:
                    del self._watched[key]
                if not self._watched:
                    self._cond.wait()
                    continue
                earliest = min(e.due for e in self._watched.values())
                if earliest > now:
                    self._cond.wait(earliest - now)
                    continue
                due = [e for e in self._watched.values() if e.due <= now]
                for entry in due:
                    entry.due = now + entry.claim.lease_ms / 3000
                return due

    def _run(self) -> None:
        while True:
            for entry in self._due():
                self._renew(entry.claim)

    def _renew(self, claim: Claim) -> None:
        try:
            renewed = operations.extend(claim.connection, claim.redis_key, claim.pending,
                                        claim.lease_ms)
        except redis.RedisError as exc:
            logger.warning("could not renew idempotency claim %s: %s (retrying at the next "
                           "beat; the lease ends if Redis stays away)", claim.key_hash[:12], exc)
            return
        if not renewed and self.watching(claim):
            self.unwatch(claim)
            logger.warning("idempotency claim %s was lost while its view ran (lease ended or "
                           "deleted); a duplicate request may run the view again",
                           claim.key_hash[:12])


_heartbeat = Heartbeat()
watch = _heartbeat.watch
unwatch = _heartbeat.unwatch
