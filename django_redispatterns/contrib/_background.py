"""What background-task integrations share: lock names from task arguments, running a task
body under a lock that interrupts it when lost, task rate limits and enqueue-once records.

Framework-neutral: :mod:`.tasks` (Django's tasks framework) and :mod:`.celery` plug in a
:class:`Framework` that knows how to defer a run (re-enqueue it later) and how to find a
result by id. Everything else lives here, built on the package's locks, rate limiter and
idempotency records: there is no locking code of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar, cast

from ..conf import get_config
from ..exceptions import (
    AlreadyEnqueued,
    IdempotencyConflict,
    LockLost,
    LockNotAcquired,
    RateLimited,
)
from ..idempotency import Fingerprint, IdempotencyStore, StoredResponse
from ..locks import DEFAULT_NAMESPACE, Lock
from ..ratelimit import RateLimiter
from ..ratelimit.rates import DEFAULT_ALGORITHM
from ..signals import lock_lost

logger = logging.getLogger("django_redispatterns.tasks")

F = TypeVar("F", bound=Callable[..., Any])
OnBusy = Literal["raise", "skip", "reschedule"]
KeySpec = str | Sequence[str] | Callable[..., str] | None
ON_BUSY = ("raise", "skip", "reschedule")

#: How long an enqueue-once record is kept by default (seconds): a day.
DEFAULT_ONCE_TTL = 86400.0


class Framework:
    """How one task framework defers a run and hands back results. Subclassed per framework."""

    name = "tasks"

    def leading(self, args: tuple[Any, ...]) -> int:
        """How many leading arguments are the framework's (a bound ``self``, a context)."""
        return 0

    def defer(self, countdown: float, error: Exception, args: tuple[Any, ...],
              kwargs: dict[str, Any], func: Callable[..., Any]) -> Any:
        """Run the task again in ``countdown`` seconds; or raise ``error`` if impossible."""
        raise error


# --- names --------------------------------------------------------------------------------


def task_name(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def _argument_part(key: KeySpec, func: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], own: int) -> str | None:
    """The part of a lock/limit name that comes from the call's arguments, or None.

    ``own``: how many leading arguments the framework passes (a bound task, a context); a
    ``key`` callable gets the rest, argument names are looked up in the whole call."""
    if key is None:
        return None
    if callable(key):
        derived = key(*args[own:], **kwargs)
        if not isinstance(derived, str) or not derived:
            raise TypeError(f"the key callable {key!r} must return a non-empty str, "
                            f"got {derived!r}")
        return derived
    names = (key,) if isinstance(key, str) else tuple(key)
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    missing = [n for n in names if n not in bound.arguments]
    if missing:
        raise TypeError(f"key names argument(s) {missing} that {func.__qualname__} "
                        f"does not take")
    return json.dumps([bound.arguments[n] for n in names], sort_keys=True, default=repr)


def derived_name(func: Callable[..., Any], key: KeySpec, args: tuple[Any, ...],
                 kwargs: dict[str, Any], own: int = 0) -> tuple[str, str]:
    """(lock name, rate-limit identity) of one call. Argument values never appear in a
    key name: they are hashed (SHA-256, unkeyed so a rotated secret keeps the name)."""
    base = task_name(func)
    part = _argument_part(key, func, args, kwargs, own)
    if part is None:
        return base, "*"
    digest = hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{base}/{digest}", part


def _check_choice(on_busy: str) -> None:
    if on_busy not in ON_BUSY:
        raise ValueError(f"on_busy must be one of {ON_BUSY}, got {on_busy!r}")


# --- interrupting a body whose lock was lost ------------------------------------------------


class _Interrupt:
    """Raises :class:`LockLost` into the thread running a task body, once, while armed.

    CPython delivers it at the thread's next bytecode: a body inside a blocking call (a
    socket read, ``time.sleep``) sees it when that call returns.
    """

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        self.guard = threading.Lock()
        self.armed = True
        self.fired = False

    def fire(self) -> None:
        with self.guard:
            if self.armed and not self.fired:
                self.fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(LockLost))

    def disarm(self) -> None:
        with self.guard:
            self.armed = False
            if self.fired:  # not delivered yet: take it back
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)


_interrupts: dict[str, _Interrupt] = {}
_interrupts_guard = threading.Lock()


def _on_lock_lost(sender: Any, token: str = "", **kwargs: Any) -> None:
    with _interrupts_guard:
        interrupt = _interrupts.get(token)
    if interrupt is not None:
        interrupt.fire()


lock_lost.connect(_on_lock_lost, dispatch_uid="django_redispatterns.contrib.tasks.interrupt")

_current: threading.local = threading.local()


def current_lock() -> Lock | None:
    """The lock held by the innermost ``@locked``/``@single_flight`` task body running in
    this thread: ``current_lock().fencing_token`` is the run's fencing token."""
    return getattr(_current, "lock", None)


def run_locked(lock: Lock, body: Callable[[], Any]) -> Any:
    """Run ``body`` holding the already acquired ``lock``; LockLost is raised into it when the
    heartbeat finds the lease lost, and on leaving when it was lost at any point."""
    token = lock.token or ""
    interrupt = _Interrupt()
    with _interrupts_guard:
        _interrupts[token] = interrupt
    outer, _current.lock = current_lock(), lock
    try:
        try:
            result = body()
        finally:
            with _interrupts_guard:
                _interrupts.pop(token, None)
            interrupt.disarm()
    except LockLost as exc:
        _current.lock = outer
        with contextlib.suppress(Exception):  # lost already: the release cannot succeed
            lock.release()
        raise (exc if exc.args else lock._lost_error()) from None
    except BaseException as exc:
        _current.lock = outer
        lock._exit(exc)
        raise
    _current.lock = outer
    lock._exit(None)
    return result


def locking(framework: Framework, *, key: KeySpec, ttl: float, on_busy: str, wait: float,
            countdown: float, namespace: str, max_hold: float | None) -> Callable[[F], F]:
    """The ``@locked``/``@single_flight`` decorator of one framework."""
    _check_choice(on_busy)
    if ttl <= 0 or countdown < 0 or wait < 0:
        raise ValueError("ttl must be > 0, countdown and wait >= 0")

    def decorator(func: F) -> F:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"{func.__qualname__}: locked tasks must be sync functions")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name, _ = derived_name(func, key, args, kwargs, framework.leading(args))
            lock = Lock(name, ttl, wait=wait, namespace=namespace, owner=task_name(func),
                        max_hold=max_hold)
            if not lock.acquire():
                if on_busy == "skip":
                    logger.info("task %s skipped: lock %r is held by another run",
                                task_name(func), name)
                    return None
                error = LockNotAcquired(f"{name!r} is locked by another run of the task")
                if on_busy == "raise":
                    raise error
                return framework.defer(countdown, error, args, kwargs, wrapper)
            return run_locked(lock, lambda: func(*args, **kwargs))

        def lock_name(*args: Any, **kwargs: Any) -> str:
            """The lock name a call with these arguments takes (for operators and tests)."""
            return derived_name(func, key, args, kwargs, framework.leading(args))[0]

        wrapper.lock_name = lock_name  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorator


# --- rate limits ----------------------------------------------------------------------------


def limiting(framework: Framework, rate: str, *, key: KeySpec, algorithm: str,
             burst: int | None) -> Callable[[F], F]:
    """The ``@rate_limited`` decorator of one framework: over the limit, the run is
    deferred by the limiter's ``retry_after`` (never dropped)."""

    def decorator(func: F) -> F:
        limiter = RateLimiter(rate, algorithm=algorithm, burst=burst,
                              group=f"task.{task_name(func)}", name=func.__name__)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _, identity = derived_name(func, key, args, kwargs, framework.leading(args))
            decision = limiter.hit(identity)
            if not decision.allowed:
                error = RateLimited(f"task {task_name(func)} is over its rate {rate}",
                                    retry_after=decision.retry_after, limit=decision.limit,
                                    remaining=decision.remaining or 0)
                return framework.defer(max(decision.retry_after, 0.001), error, args, kwargs,
                                       wrapper)
            return func(*args, **kwargs)

        return cast(F, wrapper)

    return decorator


# --- the public decorators of one framework -------------------------------------------------


class Decorators:
    """``locked``, ``single_flight`` and ``rate_limited`` bound to one framework."""

    def __init__(self, framework: Framework) -> None:
        self.framework = framework

    def locked(self, key: KeySpec = None, ttl: float = 30, *, on_busy: str = "raise",
               wait: float = 0, countdown: float = 10, namespace: str = DEFAULT_NAMESPACE,
               max_hold: float | None = None) -> Callable[[F], F]:
        """Run the task body only while holding its lock (a lease of ``ttl`` seconds,
        renewed while the body runs).

        ``key``: an argument name, a list of them, or a callable of the task's own
        arguments (without a bound ``self`` or a context) returning a str; the lock name is
        the task's path plus a hash of those values. A busy lock (after waiting ``wait``
        seconds): ``on_busy="raise"`` fails the run with LockNotAcquired, ``"skip"``
        returns None without running, ``"reschedule"`` runs it again ``countdown`` seconds
        later (where the framework cannot defer, it raises LockNotAcquired instead).
        """
        return locking(self.framework, key=key, ttl=ttl, on_busy=on_busy, wait=wait,
                       countdown=countdown, namespace=namespace, max_hold=max_hold)

    def single_flight(self, key: KeySpec = None, ttl: float = 30, *, on_busy: str = "skip",
                      countdown: float = 10, namespace: str = DEFAULT_NAMESPACE,
                      max_hold: float | None = None) -> Callable[[F], F]:
        """At most one run at a time; by default a concurrent run is skipped (returns None)."""
        return locking(self.framework, key=key, ttl=ttl, on_busy=on_busy, wait=0,
                       countdown=countdown, namespace=namespace, max_hold=max_hold)

    def rate_limited(self, rate: str, key: KeySpec = None, *,
                     algorithm: str = DEFAULT_ALGORITHM,
                     burst: int | None = None) -> Callable[[F], F]:
        """At most ``rate`` runs (per ``key`` value, with one of the rate limiter's
        algorithms); a run over it is deferred by the limiter's ``retry_after``, never
        dropped (where the framework cannot defer, it raises RateLimited)."""
        return limiting(self.framework, rate, key=key, algorithm=algorithm, burst=burst)


# --- enqueue once -----------------------------------------------------------------------------


def _store() -> IdempotencyStore:
    return IdempotencyStore(get_config().connection_for("IDEMPOTENCY"))


def _fingerprint(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Fingerprint:
    body = json.dumps([list(args), kwargs], sort_keys=True, default=repr).encode()
    return Fingerprint.of("ENQUEUE", name, b"", "application/json", body)


def enqueue_once(name: str, idempotency_key: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, enqueue: Callable[[], Any],
                 result_id: Callable[[Any], str], lookup: Callable[[str], Any],
                 ttl: float) -> Any:
    """Enqueue once per ``(task name, idempotency_key)`` for ``ttl`` seconds.

    The first call enqueues and records the result id; a later one returns
    ``lookup(id)``. The same key with other arguments raises ``IdempotencyKeyReused``; a
    call while the first is still enqueueing raises :class:`AlreadyEnqueued`.
    """
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ValueError(f"idempotency_key must be a non-empty str, got {idempotency_key!r}")
    fingerprint = _fingerprint(name, args, kwargs)
    store = _store()
    try:
        outcome = store.begin(f"task:{name}", idempotency_key, fingerprint, lease=30)
    except IdempotencyConflict as exc:
        raise AlreadyEnqueued(f"task {name} is being enqueued with this key right now",
                              task_id=None) from exc
    if isinstance(outcome, StoredResponse):
        return lookup(outcome.body.decode())
    try:
        handle = enqueue()
    except BaseException:
        store.release(outcome)
        raise
    stored = StoredResponse(201, (), result_id(handle).encode())
    if not store.complete(outcome, stored, fingerprint, ttl=ttl):
        logger.warning("task %s: the enqueue-once record was lost before it was stored; "
                       "a repeat with the same key would enqueue again", name)
    return handle
