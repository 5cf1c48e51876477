"""Keep sync leases alive: one scheduler thread, renewals run on a small thread pool.

Acquiring a lock only pushes an entry onto a heap (no thread start, usually no wake-up:
the scheduler already sleeps until its earliest deadline), and releasing only marks it
stopped. Handing every acquisition to a thread cost as much as the acquire+release round
trips themselves; with the heap, a lock held for less than ``ttl/3`` costs no thread
switch at all. Due renewals run on a pool of up to ``MAX_RENEWERS`` threads, so one slow
Redis (or quorum member) does not hold up the renewals of other locks.

Guarantees:

* after :meth:`Renewal.stop` returns, the lease is never renewed again (a renewal already
  in flight is waited for), so no heartbeat outlives its lock;
* with nothing left to renew, the scheduler and its pool exit after ``IDLE_SECONDS``;
* after ``fork()`` the child starts with an empty scheduler of its own.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

IDLE_SECONDS = 2.0
MAX_RENEWERS = 16
THREAD_NAME = "django_redispatterns-lock-heartbeat"


class Renewal:
    """One lease renewed every ``interval`` seconds by ``renew`` until it returns False."""

    def __init__(self, renew: Callable[[], bool], interval: float) -> None:
        self.renew = renew
        self.interval = interval
        self.stopped = False  # guarded by the scheduler's condition
        self.renewing = False
        self.finished = False
        self.renewer: threading.Thread | None = None

    def stop(self) -> None:
        """Stop renewing; once this returns no renewal of this lease starts or is running."""
        _scheduler.stop(self)

    @property
    def running(self) -> bool:
        """True until stopped, or until ``renew`` gave up (the lease was lost)."""
        with _scheduler.cond:
            return not (self.stopped or self.finished)


class _Scheduler:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, Renewal]] = []
        self.seq = itertools.count()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.wake_at = 0.0
        self.in_flight = 0

    def add(self, renewal: Renewal) -> None:
        due = time.monotonic() + renewal.interval
        with self.cond:
            while self.heap and self.heap[0][2].stopped:  # drop released leases cheaply
                heapq.heappop(self.heap)
            heapq.heappush(self.heap, (due, next(self.seq), renewal))
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
                self.thread.start()
            elif due < self.wake_at:
                self.cond.notify_all()

    def stop(self, renewal: Renewal) -> None:
        with self.cond:
            renewal.stopped = True
            if threading.current_thread() is not renewal.renewer:  # a lost-lease receiver
                while renewal.renewing:
                    self.cond.wait()

    def _loop(self) -> None:
        idle_since: float | None = None
        with self.cond:
            while True:
                now = time.monotonic()
                while self.heap and self.heap[0][2].stopped:
                    heapq.heappop(self.heap)
                if self.heap and self.heap[0][0] <= now:
                    renewal = heapq.heappop(self.heap)[2]
                    renewal.renewing = True
                    self.in_flight += 1
                    if self.pool is None:
                        self.pool = ThreadPoolExecutor(MAX_RENEWERS, thread_name_prefix=THREAD_NAME)
                    self.pool.submit(self._renew, renewal)
                    continue
                if self.heap or self.in_flight:
                    idle_since = None
                    timeout = self.heap[0][0] - now if self.heap else IDLE_SECONDS
                else:
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since >= IDLE_SECONDS:
                        self.thread = None
                        if self.pool is not None:
                            self.pool.shutdown(wait=False)
                            self.pool = None
                        return
                    timeout = IDLE_SECONDS - (now - idle_since)
                self.wake_at = now + timeout
                self.cond.wait(timeout)
                self.wake_at = 0.0

    def _renew(self, renewal: Renewal) -> None:
        renewal.renewer = threading.current_thread()
        keep = False
        try:
            keep = renewal.renew()
        finally:
            with self.cond:
                renewal.renewing = False
                renewal.renewer = None
                self.in_flight -= 1
                if keep and not renewal.stopped:
                    heapq.heappush(self.heap, (time.monotonic() + renewal.interval,
                                               next(self.seq), renewal))
                elif not keep:
                    renewal.finished = True
                self.cond.notify_all()

    def reset(self) -> None:
        # After fork() the child has none of the parent's threads.
        self.__init__()  # type: ignore[misc]


_scheduler = _Scheduler()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_scheduler.reset)


def start(renew: Callable[[], bool], interval: float) -> Renewal:
    """Renew a lease every ``interval`` seconds until stopped or ``renew`` returns False."""
    renewal = Renewal(renew, interval)
    _scheduler.add(renewal)
    return renewal


def live_workers() -> int:
    """Heartbeat threads alive in this process (scheduler and renewers); for tests."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_NAME))
