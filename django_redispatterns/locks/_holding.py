"""Holding a lease: the heartbeat that renews it, extend(), and noticing it was lost.

:class:`Holding` is mixed into the lock classes; it uses only the lease store
(:mod:`._lease`/:mod:`._quorum`) and the heartbeat scheduler (:mod:`._heartbeat`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from .. import signals
from ..exceptions import BackendUnavailable
from . import _errors, _heartbeat
from ._lease import EXTEND, Server
from ._names import check_seconds, ms

logger = logging.getLogger("django_redispatterns.locks")


class Holding:
    """The lease bookkeeping of a held lock (sync heartbeat thread or asyncio task)."""

    names: tuple[str, ...]
    ttl: float
    max_hold: float | None
    _hold_ends: float  # time.monotonic() after which the lease is never renewed (max_hold)
    token: str | None
    fencing_tokens: dict[str, int]
    _store: Server
    _lost_reason: str | None
    _lease_ends: float  # time.monotonic() after which the lease may be gone
    _renewal: _heartbeat.Renewal | None
    _task: asyncio.Task[None] | None
    _state: threading.Lock

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else ",".join(self.names)

    @property
    def lost(self) -> bool:
        """True once the heartbeat (or a release) found the lease gone or taken over."""
        return self._lost_reason is not None

    def check(self) -> None:
        """Raise :class:`LockLost` now if the lease is known to be lost (a checkpoint)."""
        if self._lost_reason is not None:
            raise self._lost_error()

    def _lost_error(self) -> Exception:
        return _errors.lost(self.label, self._lost_reason)

    def _fence_value(self) -> int | None:
        return max(self.fencing_tokens.values()) if self.fencing_tokens else None

    # -- heartbeat ---------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._renewal = _heartbeat.start(self._renew, self.ttl / 3)

    def _stop_heartbeat(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.stop()

    def _hold_left(self) -> float:
        """Seconds until max_hold is reached (infinite without max_hold)."""
        return self._hold_ends - time.monotonic()

    def _next_lease(self) -> float | None:
        """What the next renewal may extend the lease to; None once max_hold is reached.

        The last renewals are cut short so the lease ends when max_hold does.
        """
        left = self._hold_left()
        if left <= 0.001:
            self._mark_lost(f"held for max_hold={self.max_hold:g}s, so the heartbeat "
                            "stopped renewing it")
            return None
        return min(self.ttl, left)

    def _renew(self) -> bool:
        """One heartbeat: extend the lease; False (stop renewing) once it is lost."""
        token = self.token
        if token is None:
            return False
        seconds = self._next_lease()
        if seconds is None:
            return False
        renewal = self._renewal
        if renewal is not None:  # the next beat comes no later than the end of max_hold
            renewal.interval = min(self.ttl / 3, seconds)
        sent = time.monotonic()
        try:
            still = self._store.count(EXTEND, [token, ms(seconds)], "renew")
        except BackendUnavailable as exc:
            return self._renewed(token, sent, 0, exc, seconds)
        return self._renewed(token, sent, still, None, seconds)

    def _start_aheartbeat(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._aheartbeat())

    async def _aheartbeat(self) -> None:
        pause = self.ttl / 3
        while True:
            await asyncio.sleep(pause)
            token = self.token
            if token is None:
                return
            seconds = self._next_lease()
            if seconds is None:
                return
            pause = min(self.ttl / 3, seconds)
            sent = time.monotonic()
            try:
                still = await self._store.acount(EXTEND, [token, ms(seconds)], "renew")
            except BackendUnavailable as exc:
                if not self._renewed(token, sent, 0, exc, seconds):
                    return
                continue
            if not self._renewed(token, sent, still, None, seconds):
                return

    async def _astop_heartbeat(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _renewed(self, token: str, sent: float, still: int,
                 error: BackendUnavailable | None, seconds: float) -> bool:
        """Book one heartbeat's outcome; False once the lease is known to be lost."""
        if error is not None:
            signals.lock_renew_failed.send(type(self), name=self.label, token=token,
                                           fencing_token=self._fence_value())
            if time.monotonic() >= self._lease_ends:
                self._mark_lost(f"could not renew it before the lease ran out ({error})")
                return False
            return True
        if still < len(self.names):
            self._mark_lost("the lease expired or another owner took it over")
            return False
        self._lease_ends = sent + seconds
        return True

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        logger.error("lock %r lost while held (fencing token %s): %s",
                     self.label, self._fence_value(), reason)
        signals.lock_lost.send(type(self), name=self.label, token=self.token or "",
                               fencing_token=self._fence_value())

    # -- extend ------------------------------------------------------------------------

    def _extend_args(self, ttl: float | None) -> tuple[str, float]:
        seconds = self.ttl if ttl is None else check_seconds("ttl", ttl, allow_zero=False)
        token = self.token
        if token is None:
            raise _errors.not_owned(self.label, "extend")
        left = self._hold_left()
        if left <= 0.001:
            self._mark_lost(f"held for max_hold={self.max_hold:g}s; extend refused")
            raise _errors.not_owned(self.label, "extend")
        return token, min(seconds, left)

    def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining lease to ``ttl`` seconds (default: the lock's ttl).

        No limit on how often, but never past ``max_hold`` from the acquisition (the lease
        is cut short to end there). Raises :class:`LockNotOwned` when the lock is no longer
        ours or max_hold is reached; another owner's lease is never touched.
        """
        token, seconds = self._extend_args(ttl)
        sent = time.monotonic()
        self._after_extend(self._store.count(EXTEND, [token, ms(seconds)], "extend"), sent,
                           seconds)

    async def aextend(self, ttl: float | None = None) -> None:
        """Async twin of :meth:`extend`."""
        token, seconds = self._extend_args(ttl)
        sent = time.monotonic()
        extended = await self._store.acount(EXTEND, [token, ms(seconds)], "extend")
        self._after_extend(extended, sent, seconds)

    def _after_extend(self, extended: int, sent: float, seconds: float) -> None:
        if extended < len(self.names):
            self._mark_lost("extend found the lease gone or taken over")
            raise _errors.not_owned(self.label, "extend")
        self._lease_ends = sent + seconds
