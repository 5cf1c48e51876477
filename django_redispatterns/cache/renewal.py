"""Keeps the claims of computing callers alive: one daemon thread per process.

A ``get_or_set`` claim is short (a few socket timeouts) so that a claim nobody works on
ends soon. While a caller's callable runs, :func:`start` has this thread extend its claim
every third of that lease (``lua/cache_renew.lua``, owner-checked). Starting is a push
onto a heap and stopping sets a flag: a computation shorter than a third of the lease
costs no renewal and no thread switch. The thread runs for sync and async callers alike
(it keeps renewing while an event loop is busy) and exits when it has had nothing to do
for :data:`IDLE_SECONDS`; after ``fork()`` the child starts with an empty schedule.

Renewals run one after the other: a renewal that hangs on an unresponsive server (at most
one socket timeout) delays the others by that much, which the lease's three thirds allow
once. Being owner-checked, a renewal that runs after its caller stopped it changes
nothing.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("django_redispatterns.cache")

IDLE_SECONDS = 5.0
THREAD_NAME = "django_redispatterns-cache-renewal"


class Beat:
    """One claim renewed every ``interval`` seconds by ``renew`` until it returns False
    or :meth:`stop` is called."""

    __slots__ = ("interval", "renew", "stopped")

    def __init__(self, renew: Callable[[], bool], interval: float) -> None:
        self.renew = renew
        self.interval = interval
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class _Schedule:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, Beat]] = []
        self.seq = itertools.count()
        self.thread: threading.Thread | None = None

    def add(self, beat: Beat) -> None:
        with self.cond:
            self._push(beat)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self.thread.start()
            elif self.heap[0][2] is beat:
                self.cond.notify()

    def _push(self, beat: Beat) -> None:
        heapq.heappush(self.heap, (time.monotonic() + beat.interval, next(self.seq), beat))

    def _next(self) -> Beat | None:
        """Wait for the next due beat; None (and the thread ends) after an idle spell."""
        with self.cond:
            while True:
                while self.heap and self.heap[0][2].stopped:
                    heapq.heappop(self.heap)
                now = time.monotonic()
                if not self.heap:
                    self.cond.wait(IDLE_SECONDS)
                    if not self.heap:
                        self.thread = None
                        return None
                    continue
                due = self.heap[0][0]
                if due <= now:
                    return heapq.heappop(self.heap)[2]
                self.cond.wait(due - now)

    def _run(self) -> None:
        while (beat := self._next()) is not None:
            try:
                keep = beat.renew()
            except Exception:  # never let one renewal end the thread
                logger.exception("cache: renewing a compute claim failed")
                keep = False
            if keep and not beat.stopped:
                with self.cond:
                    self._push(beat)


_schedule = _Schedule()


def _forget_after_fork() -> None:
    global _schedule
    _schedule = _Schedule()  # the parent's thread and claims are not the child's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def start(renew: Callable[[], bool], interval: float) -> Beat:
    """Call ``renew`` every ``interval`` seconds (first after one interval) until it
    returns False or the returned beat is stopped."""
    beat = Beat(renew, interval)
    _schedule.add(beat)
    return beat
