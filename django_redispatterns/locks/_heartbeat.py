"""Keep leases alive: one dedicated (pooled) daemon thread per held sync lock.

Each held lock with ``auto_renew`` gets a worker thread of its own for as long as it is
held, so one slow renewal never delays another lock's. Workers are pooled: a released
lock hands its thread back, and an idle worker exits after ``IDLE_SECONDS``. Starting a
thread for every acquisition would cost about as much as the two Redis round trips of an
acquire+release cycle; the pool keeps that cost off the hot path.

Guarantee: after :meth:`Renewal.stop` returns, the lock is never renewed again (a renewal
in flight is waited for), so no heartbeat outlives its lock; idle threads exit on their own.
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
        self._wake = threading.Event()
        self._state = threading.Condition()
        self._stopped = False
        self._renewing = False
        self._finished = False
        self._thread: threading.Thread | None = None
        self.worker: _Worker | None = None

    def run(self) -> None:
        self._thread = threading.current_thread()
        try:
            while not self._wake.wait(self.interval):
                with self._state:
                    if self._stopped:
                        return
                    self._renewing = True
                try:
                    keep_going = self.renew()
                finally:
                    with self._state:
                        self._renewing = False
                        self._state.notify_all()
                if not keep_going:
                    return
        finally:
            with self._state:
                self._finished = True

    def stop(self) -> None:
        """Stop renewing; once this returns, no renewal of this lease starts or is running.

        Does not wait for the worker thread to wake up (that would cost a thread switch on
        every release): only a renewal already in flight is waited for.
        """
        with self._state:
            self._stopped = True
            if threading.current_thread() is not self._thread:  # a lost-lease receiver may call us
                while self._renewing:
                    self._state.wait()
        self._wake.set()
        if self.worker is not None:
            _pool.give_back(self.worker, self)

    @property
    def running(self) -> bool:
        """True until stopped (or until the renewer gave up on a lost lease)."""
        with self._state:
            return not (self._stopped or self._finished)


class _Worker(threading.Thread):
    def __init__(self, pool: _Pool) -> None:
        super().__init__(name="django_redispatterns-lock-heartbeat", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[Renewal] = queue.SimpleQueue()
        self.current: Renewal | None = None  # guarded by pool.mutex

    def run(self) -> None:
        # Jobs run one after another: a stopped job ends at once (its wake event is set), so
        # a worker handed back at stop() time can take the next lease right away.
        while True:
            try:
                job = self.jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self.pool.mutex:
                    if self.current is None and self.jobs.empty():
                        self.pool.idle.remove(self)
                        return
                continue
            job.run()
            self.pool.give_back(self, job)  # the lease was lost: free for the next one


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
            worker.current = renewal
        renewal.worker = worker
        worker.jobs.put(renewal)
        return renewal

    def give_back(self, worker: _Worker, job: Renewal) -> None:
        with self.mutex:
            if worker.current is job:  # not already handed on to another lease
                worker.current = None
                self.idle.append(worker)

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
