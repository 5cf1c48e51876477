"""In-process single flight: callers of one process that miss the same key share one
attempt.

One leader talks to Redis (claims, or waits on one connection); the others wait on a
local event (threads) or future (coroutines of one event loop) and get a private copy of
its value. A leader's exception is its own: the followers then elect a new leader. Every
follower waits at most ``max_wait`` seconds in all, then runs the attempt itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .stampede import Reporter

FlightKey = tuple[str, str]  # (the server, the Redis key)
_FAILED = object()


class _Flight:
    """One in-process get_or_set attempt that other threads missing the key wait for."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


_flights: dict[FlightKey, _Flight] = {}
_flights_lock = threading.Lock()
_async_flights: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[FlightKey, asyncio.Future[Any]]
] = weakref.WeakKeyDictionary()


class Coalescer:
    """Shares one attempt among this process's callers; ``run(waited)`` is the attempt
    (``waited``: seconds this caller already spent waiting for a failed leader)."""

    def __init__(self, max_wait: float, report: Reporter, copy: Callable[[Any], Any]) -> None:
        self.max_wait = max_wait
        self._report = report
        self._copy = copy

    def run(self, key: Any, flight_key: FlightKey, run: Callable[[float], Any]) -> Any:
        started = time.monotonic()
        waited = 0.0  # > 0 once we waited for a leader that failed: counts against the wait
        while True:
            with _flights_lock:
                flight = _flights.get(flight_key)
                leader = flight is None
                if flight is None:
                    flight = _flights[flight_key] = _Flight()
            if leader:
                try:
                    flight.value = run(waited)
                    flight.ok = True
                    return flight.value
                finally:
                    with _flights_lock:
                        if _flights.get(flight_key) is flight:
                            del _flights[flight_key]
                    flight.done.set()
            remaining = self.max_wait - (time.monotonic() - started)
            if remaining <= 0:
                return run(self.max_wait)  # computes on its own if still held
            if flight.done.wait(remaining) and flight.ok:
                self._report.waited(key, started, got_value=True)
                return self._copy(flight.value)
            waited = time.monotonic() - started

    async def arun(self, key: Any, flight_key: FlightKey,
                   run: Callable[[float], Awaitable[Any]]) -> Any:
        """:meth:`run` for coroutines of one event loop."""
        loop = asyncio.get_running_loop()
        flights = _async_flights.setdefault(loop, {})
        started = time.monotonic()
        waited = 0.0
        while True:
            flight = flights.get(flight_key)
            if flight is None:
                flight = flights[flight_key] = loop.create_future()
                try:
                    value = await run(waited)
                except BaseException:
                    flight.set_result(_FAILED)
                    raise
                else:
                    flight.set_result(value)
                    return value
                finally:
                    if flights.get(flight_key) is flight:
                        del flights[flight_key]
            remaining = self.max_wait - (time.monotonic() - started)
            if remaining <= 0:
                return await run(self.max_wait)
            try:
                value = await asyncio.wait_for(asyncio.shield(flight), remaining)
            except asyncio.TimeoutError:
                value = _FAILED
            if value is not _FAILED:
                self._report.waited(key, started, got_value=True)
                return self._copy(value)
            waited = time.monotonic() - started
