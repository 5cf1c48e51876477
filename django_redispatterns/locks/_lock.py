"""Lock and MultiLock: leased, owner-checked, fenced locks on one Redis or a Redlock quorum.

This module is the public face only; the parts live below it: :mod:`._names` (keys,
tokens), :mod:`._options` (validated, cached options), :mod:`._lease` (one server) and
:mod:`._quorum` (Redlock), :mod:`._waiting` (wake-ups and back-off), :mod:`._holding`
(heartbeat, extend, lost leases), :mod:`._errors`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from .. import signals
from ..exceptions import BackendUnavailable, LockNotOwned
from . import _errors, _options, _waiting
from ._holding import Holding
from ._lease import Attempt, Server
from ._names import DEFAULT_NAMESPACE, check_name, check_seconds, new_token
from ._quorum import Quorum

logger = logging.getLogger("django_redispatterns.locks")


class _Base(Holding):
    """What Lock and MultiLock share: options, acquire/release and the ``with`` protocol."""

    def __init__(
        self,
        names: Sequence[str],
        ttl: float | None,
        *,
        wait: float,
        auto_renew: bool,
        namespace: str,
        connection: str | None,
        quorum: Sequence[str] | None,
        owner: str | None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
        max_hold: float | None = None,
    ) -> None:
        p = _options.plan(names, ttl, wait, auto_renew, namespace, connection, quorum,
                          min_replicas, replica_timeout, max_hold)
        self._plan = p
        self.names: tuple[str, ...] = p.names
        self.namespace = p.namespace
        self.ttl = p.ttl
        self.wait = p.wait
        self.auto_renew = p.auto_renew
        self.max_hold = p.max_hold
        self.min_replicas = p.min_replicas
        self.replica_timeout = p.replica_timeout
        self._hold_ends = float("inf")
        self._held_keys = p.target.held_keys
        self._fence_keys = p.target.fence_keys
        self._store: Server = Quorum(p.target) if p.quorum else Server(p.target)
        self._owner = owner
        self.token: str | None = None
        self.fencing_tokens: dict[str, int] = {}
        self._lost_reason: str | None = None
        self._lease_ends = 0.0
        self._renewal = None
        self._task = None
        self._state = threading.Lock()

    # -- description -------------------------------------------------------------------

    @property
    def quorum_mode(self) -> bool:
        return self._store.quorum_mode

    def __repr__(self) -> str:
        state = "held" if self.token else "free"
        return f"<{type(self).__name__} {self.label!r} ttl={self.ttl:g}s {state}>"

    def _meta(self) -> str:
        head = _options.meta_head(self._plan.label, self._owner or "", os.getpid())
        return f'{head},"since":{time.time():.3f}}}'

    def _acquire_call(self, token: str) -> tuple[list[str], list[Any]]:
        return (self._store.target.acquire_keys,
                [token, self._plan.ttl_ms, self._store.target.fencing_ttl_ms, self._meta()])

    def owned(self) -> bool:
        """True when Redis still holds this instance's token for every name (one read)."""
        token = self.token
        return token is not None and self._store.owned(token)

    # -- acquiring ---------------------------------------------------------------------

    def _begin(self, wait: float | None) -> tuple[str, _waiting.Waiter]:
        seconds = self.wait if wait is None else check_seconds("wait", wait, allow_zero=True)
        with self._state:
            if self.token is not None:
                raise RuntimeError(
                    f"{self!r} is already held by this instance; locks are not reentrant "
                    "(create one Lock per holder, they are cheap)"
                )
            token = new_token()
            self.token = token  # reserve the instance while the attempt runs
        return token, _waiting.Waiter(self._store, self._held_keys, seconds)

    def _won(self, token: str, attempt: Attempt) -> None:
        self.fencing_tokens = dict(zip(self.names, attempt.fences, strict=True))
        self._lost_reason = None
        self._lease_ends = attempt.started + attempt.validity
        if self.max_hold is not None:
            self._hold_ends = attempt.started + self.max_hold
        logger.debug("lock %r acquired (fencing token %s)", self.label, attempt.fences)
        if signals.lock_acquired.receivers:  # sent only when listened to (hot path)
            signals.lock_acquired.send(type(self), name=self.label, token=token,
                                       fencing_token=self._fence_value())

    def _report_wait(self, waiter: _waiting.Waiter, *, acquired: bool) -> None:
        if signals.lock_waited.receivers:  # sent only when listened to (hot path)
            signals.lock_waited.send(type(self), name=self.label, acquired=acquired,
                                     seconds=time.monotonic() - waiter.started)

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the ``wait`` given).

        Returns True when every name is now held by this instance with a fresh token and
        fencing token(s); False when another owner still held it when the wait ran out.
        Raises :class:`BackendUnavailable` when Redis cannot be reached (fail closed).
        """
        token, waiter = self._begin(wait)
        try:
            while True:
                waiter.before_attempt()
                keys_, args = waiter.acquire_call(*self._acquire_call(token))
                attempt = self._store.attempt(token, keys_, args, self.ttl)
                if attempt.ok:
                    break
                if not waiter.sleep(attempt):
                    self.token = None
                    self._report_wait(waiter, acquired=False)
                    return False
        except BaseException:
            self.token = None
            raise
        self._won(token, attempt)
        if waiter.slept:
            self._report_wait(waiter, acquired=True)
        if self.auto_renew:
            self._start_heartbeat()
        return True

    async def aacquire(self, wait: float | None = None) -> bool:
        """Async twin of :meth:`acquire` (heartbeat: an asyncio task on this loop)."""
        token, waiter = self._begin(wait)
        try:
            while True:
                keys_, args = waiter.acquire_call(*self._acquire_call(token))
                attempt = await self._store.aattempt(token, keys_, args, self.ttl)
                if attempt.ok:
                    break
                if not await waiter.asleep(attempt):
                    self.token = None
                    self._report_wait(waiter, acquired=False)
                    return False
        except BaseException:
            self.token = None
            raise
        self._won(token, attempt)
        if waiter.slept:
            self._report_wait(waiter, acquired=True)
        if self.auto_renew:
            self._start_aheartbeat()
        return True

    # -- releasing ---------------------------------------------------------------------

    def release(self) -> None:
        """Give the lock up. Only ever deletes keys that still hold this instance's token.

        Raises :class:`LockNotOwned` when the lock is not (or no longer) ours.
        """
        token = self.token
        if token is None:
            raise _errors.not_owned(self.label, "release")
        self._stop_heartbeat()
        try:
            released = self._store.release(token)
        finally:
            self.token = None
            _waiting.wakeups.notify(self._held_keys)
        self._after_release(released)

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        token = self.token
        if token is None:
            raise _errors.not_owned(self.label, "release")
        await self._astop_heartbeat()
        try:
            released = await self._store.arelease(token)
        finally:
            self.token = None
        self._after_release(released)

    def _after_release(self, released: int) -> None:
        if released < len(self.names):
            self._mark_lost("release found the lease gone or taken over")
            raise _errors.not_owned(self.label, "release")

    # -- the with protocol -------------------------------------------------------------

    def _exit(self, exc: BaseException | None) -> None:
        lost_before = self.lost
        try:
            self.release()
        except (LockNotOwned, BackendUnavailable) as release_error:
            self._after_exit(exc, lost_before, release_error)
            return
        self._after_exit(exc, lost_before, None)

    def _after_exit(self, exc: BaseException | None, lost_before: bool,
                    release_error: Exception | None) -> None:
        """What leaving a ``with`` block raises, given how the release went."""
        if release_error is not None:
            if exc is not None:  # never mask the body's own exception
                logger.error("lock %r: release after a failed block also failed: %s",
                             self.label, release_error)
                return
            if isinstance(release_error, BackendUnavailable) and not lost_before:
                raise release_error
            raise self._lost_error() from release_error
        if lost_before and exc is None:
            raise self._lost_error()

    def __enter__(self) -> Any:
        if not self.acquire():
            raise _errors.not_acquired(self.label, self.wait)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._exit(exc)

    async def __aenter__(self) -> Any:
        if not await self.aacquire():
            raise _errors.not_acquired(self.label, self.wait)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        lost_before = self.lost
        try:
            await self.arelease()
        except (LockNotOwned, BackendUnavailable) as release_error:
            self._after_exit(exc, lost_before, release_error)
            return
        self._after_exit(exc, lost_before, None)


class Lock(_Base):
    """A leased, owner-checked, fenced lock on one name.

    ``Lock(name, ttl=30, *, wait=0, auto_renew=True)``. Guarantees:

    * acquire is one round trip (one script: ``SET NX PX`` plus the fencing token);
    * :attr:`token` is fresh and random (128 bits) for every acquisition, and
      :attr:`fencing_token` is larger than that of every earlier acquisition of the name;
    * release/extend only ever touch the key while it holds this acquisition's token;
    * with ``auto_renew`` a heartbeat extends the lease every ``ttl/3``; when it finds the
      lease lost, leaving the ``with`` block raises :class:`LockLost`;
    * with ``max_hold`` no renewal (heartbeat or :meth:`extend`) keeps the lease past
      ``max_hold`` seconds from the acquisition: the heartbeat stops there and the holder
      is told the same way as for a lost lease (:attr:`lost`, :meth:`check`, and
      :class:`LockLost` when leaving the ``with`` block).

    One instance is one holder: create a Lock per thread or task (they are cheap).
    """

    def __init__(
        self,
        name: str,
        ttl: float | None = None,
        *,
        wait: float = 0,
        auto_renew: bool = True,
        namespace: str = DEFAULT_NAMESPACE,
        connection: str | None = None,
        quorum: Sequence[str] | None = None,
        owner: str | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
        max_hold: float | None = None,
    ) -> None:
        super().__init__([check_name(name)], ttl, wait=wait, auto_renew=auto_renew,
                         namespace=namespace, connection=connection, quorum=quorum,
                         owner=owner, min_replicas=min_replicas,
                         replica_timeout=replica_timeout, max_hold=max_hold)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current (or last) acquisition; None before the first."""
        return self.fencing_tokens.get(self.names[0])

    def __enter__(self) -> Lock:
        return super().__enter__()

    async def __aenter__(self) -> Lock:
        return await super().__aenter__()


class MultiLock(_Base):
    """All-or-nothing over several names of one namespace, in one script.

    Either every name is taken with one token (and one fencing token each, in
    :attr:`fencing_tokens`), or none is; there is no partial hold, so no deadlock. The
    names share the namespace's hash tag, so this works unchanged on Redis Cluster.
    """

    def __init__(
        self,
        names: Iterable[str],
        ttl: float | None = None,
        *,
        wait: float = 0,
        auto_renew: bool = True,
        namespace: str = DEFAULT_NAMESPACE,
        connection: str | None = None,
        quorum: Sequence[str] | None = None,
        owner: str | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
        max_hold: float | None = None,
    ) -> None:
        if isinstance(names, str):
            raise TypeError("MultiLock takes a list of names, not one str (use Lock)")
        unique = sorted({check_name(n) for n in names})
        if not unique:
            raise ValueError("MultiLock needs at least one name")
        super().__init__(unique, ttl, wait=wait, auto_renew=auto_renew, namespace=namespace,
                         connection=connection, quorum=quorum, owner=owner,
                         min_replicas=min_replicas, replica_timeout=replica_timeout,
                         max_hold=max_hold)

    @property
    def fencing_token(self) -> int | None:
        """The largest fencing token of the current acquisition."""
        return self._fence_value()

    def __enter__(self) -> MultiLock:
        return super().__enter__()

    async def __aenter__(self) -> MultiLock:
        return await super().__aenter__()
