"""Keep leases alive: one dedicated (pooled) daemon thread per held sync lock.

Each held lock with ``auto_renew`` gets a worker thread of its own for as long as it is
held, so one slow renewal never delays another lock's. Workers are pooled: a released
lock hands its thread back, and an idle worker exits after ``IDLE_SECONDS``. Starting a
thread for every acquisition would cost about as much as the two Redis round trips of an
acquire+release cycle; the pool keeps that cost off the hot path.

Guarantee: after :meth:`Renewal.stop` returns, the lock is never renewed again (a renewal
in flight is waited for), so no heartbeat outlives its lock.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

IDLE_SECONDS = 2.0


class Renewal:
    """One lease being renewed every ``interval`` seconds by ``renew`` (False = stop)."""

    def __init__(self, renew: Callable[[], bool], interval: float) -> None:
        self.renew = renew
        self.interval = interval
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        self._thread = threading.current_thread()
        try:
            while not self._stop.wait(self.interval):
                if not self.renew():
                    return
        finally:
            self._done.set()

    def stop(self) -> None:
        """Stop renewing; returns once no renewal of this lease can run any more."""
        self._stop.set()
        if threading.current_thread() is not self._thread:  # a lost-lease receiver may call us
            self._done.wait()

    @property
    def running(self) -> bool:
        return not self._done.is_set()


class _Worker(threading.Thread):
    def __init__(self, pool: _Pool) -> None:
        super().__init__(name="django_redispatterns-lock-heartbeat", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[Renewal] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self.pool.mutex:
                    if self in self.pool.idle:  # nobody is about to hand us a job
                        self.pool.idle.remove(self)
                        return
                continue
            try:
                job.run()
            finally:
                with self.pool.mutex:
                    self.pool.idle.append(self)


class _Pool:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.idle: list[_Worker] = []

    def start(self, renewal: Renewal) -> Renewal:
        with self.mutex:
            worker = self.idle.pop() if self.idle else None
        if worker is None:
            worker = _Worker(self)
            worker.start()
        worker.jobs.put(renewal)
        return renewal

    def reset(self) -> None:
        # After fork() the child has none of the parent's threads.
        self.mutex = threading.Lock()
        self.idle = []


_pool = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.reset)


def start(renew: Callable[[], bool], interval: float) -> Renewal:
    """Renew a lease every ``interval`` seconds on a pooled daemon thread."""
    return _pool.start(Renewal(renew, interval))


def live_workers() -> int:
    """Heartbeat threads alive in this process (busy or idle); for tests and debugging."""
    return sum(1 for t in threading.enumerate() if isinstance(t, _Worker))
