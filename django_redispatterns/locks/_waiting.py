"""Waiting for a held lock: a bounded, jittered back-off, cut short by wake-ups.

A release in this process wakes this process's waiters of that key at once. Waiters never
spin on Redis: between attempts they sleep at most the back-off step, never past their
deadline or the holder's remaining lease.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._lease import Attempt

MIN_DELAY = 0.005  # first back-off step while waiting (seconds)
MAX_DELAY = 0.2  # back-off cap: a waiter asks Redis at most ~5 times a second


class Wakeups:
    """Per-key wake-ups for waiters in this process: a release wakes one waiter of its key.

    Waking one (not all) avoids a herd of attempts of which all but one must fail; the rest
    keep their back-off timers, so a missed or wasted wake-up costs at most one back-off step.
    """

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.waiting: dict[str, list[Any]] = {}  # key -> [Condition, waiters]
        self.releases: dict[str, int] = {}

    def generation(self, key: str) -> int:
        return self.releases.get(key, 0)

    def notify(self, keys: Sequence[str]) -> None:
        if not self.waiting:  # the common, uncontended case takes no lock
            return
        with self.mutex:
            for key in keys:
                self.releases[key] = self.releases.get(key, 0) + 1
                entry = self.waiting.get(key)
                if entry is not None:
                    with entry[0]:
                        entry[0].notify()

    def sleep(self, key: str, seconds: float, generation: int) -> None:
        with self.mutex:
            entry = self.waiting.setdefault(key, [threading.Condition(), 0])
            entry[1] += 1
            condition = entry[0]
        try:
            with condition:
                if self.releases.get(key, 0) == generation:
                    condition.wait(seconds)
        finally:
            with self.mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.waiting[key]
                    self.releases.pop(key, None)


wakeups = Wakeups()


def backoff(attempt: Attempt, delay: float, remaining: float) -> float:
    """Full jitter spreads waiters; never sleep past our deadline or the holder's lease."""
    pause = random.uniform(delay / 2, delay)
    if attempt.holder_pttl > 0:
        pause = min(pause, attempt.holder_pttl / 1000 + 0.001)
    return max(0.0, min(pause, remaining))


class Waiter:
    """The state of one acquire that may wait: its deadline and its back-off step."""

    def __init__(self, held_keys: Sequence[str], wait: float) -> None:
        self.held_keys = held_keys
        self.deadline = time.monotonic() + wait
        self.delay = MIN_DELAY
        self.generations: list[int] = []

    def before_attempt(self) -> None:
        """Note the release count of each key, so a release during the attempt is not missed."""
        self.generations = [wakeups.generation(k) for k in self.held_keys]

    def _pause(self, attempt: Attempt) -> float | None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        pause = backoff(attempt, self.delay, remaining)
        self.delay = min(self.delay * 2, MAX_DELAY)
        return pause

    def sleep(self, attempt: Attempt) -> bool:
        """Wait before the next attempt; False when the deadline has passed (give up)."""
        pause = self._pause(attempt)
        if pause is None:
            return False
        i = max(0, attempt.conflict - 1)
        wakeups.sleep(self.held_keys[i], pause, self.generations[i] if self.generations else 0)
        return True

    async def asleep(self, attempt: Attempt) -> bool:
        """Async twin of :meth:`sleep` (back-off only)."""
        pause = self._pause(attempt)
        if pause is None:
            return False
        await asyncio.sleep(pause)
        return True
