"""In-process single flight: callers of one process that miss the same key share one
attempt.

One leader talks to Redis (claims, or waits on one connection); the others wait on a
local event (threads) or future (coroutines of one event loop) and get a private copy of
its value. The callable's exception is the leader's own: the followers then elect a new
leader. A Redis failure is everyone's: an attempt raises :class:`SharedFailure`, and the
leader and every follower raise that error at once (a follower a copy of it), instead of
trying again one after the other. Every follower waits at most ``max_wait`` seconds in
all, then runs the attempt itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .stampede import Reporter

FlightKey = tuple[str, str]  # (the server, the Redis key)
T = TypeVar("T")
_FAILED = object()  # the leader's callable raised: elect a new leader


class SharedFailure(Exception):
    """Raised by an attempt when Redis failed (not the callable): ``error`` is what every
    caller sharing the attempt raises."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _Shared:
    """The outcome of an attempt that failed on Redis (a follower raises a copy)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def again(error: BaseException) -> BaseException:
    """A follower's own copy of the leader's Redis error (exceptions carry tracebacks:
    one object must not be raised in several threads)."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        copy = RuntimeError(str(error))
    copy.__cause__ = error
    return copy


def alone(run: Callable[[float], T]) -> T:
    """Run an attempt nobody else waits for: a shared failure is just its error."""
    try:
        return run(0.0)
    except SharedFailure as failure:
        raise failure.error from None


async def aalone(run: Callable[[float], Awaitable[T]]) -> T:
    try:
        return await run(0.0)
    except SharedFailure as failure:
        raise failure.error from None


class _Flight:
    """One in-process get_or_set attempt that other threads missing the key wait for."""

    __slots__ = ("done", "failure", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None
        self.failure: BaseException | None = None  # a Redis error every caller raises


_flights: dict[FlightKey, _Flight] = {}
_flights_lock = threading.Lock()
_async_flights: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[FlightKey, asyncio.Future[Any]]
] = weakref.WeakKeyDictionary()


class Coalescer:
    """Shares one attempt among this process's callers; ``attempt(waited)`` runs it
    (``waited``: seconds this caller already spent waiting for a failed leader)."""

    def __init__(self, max_wait: float, report: Reporter, copy: Callable[[Any], Any]) -> None:
        self.max_wait = max_wait
        self._report = report
        self._copy = copy

    def run(self, key: Any, flight_key: FlightKey, attempt: Callable[[float], Any]) -> Any:
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
                    flight.value = attempt(waited)
                    flight.ok = True
                    return flight.value
                except SharedFailure as failure:
                    flight.failure = failure.error
                    raise failure.error from None
                finally:
                    with _flights_lock:
                        if _flights.get(flight_key) is flight:
                            del _flights[flight_key]
                    flight.done.set()
            remaining = self.max_wait - (time.monotonic() - started)
            if remaining <= 0:
                return alone(lambda _: attempt(self.max_wait))  # computes on its own if held
            if flight.done.wait(remaining):
                if flight.ok:
                    self._report.waited(key, started, got_value=True)
                    return self._copy(flight.value)
                if flight.failure is not None:
                    raise again(flight.failure)
            waited = time.monotonic() - started

    async def arun(self, key: Any, flight_key: FlightKey,
                   attempt: Callable[[float], Awaitable[Any]]) -> Any:
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
                    value = await attempt(waited)
                except SharedFailure as failure:
                    flight.set_result(_Shared(failure.error))
                    raise failure.error from None
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
                return await aalone(lambda _: attempt(self.max_wait))
            try:
                value = await asyncio.wait_for(asyncio.shield(flight), remaining)
            except asyncio.TimeoutError:
                value = _FAILED
            if isinstance(value, _Shared):
                raise again(value.error)
            if value is not _FAILED:
                self._report.waited(key, started, got_value=True)
                return self._copy(value)
            waited = time.monotonic() - started
