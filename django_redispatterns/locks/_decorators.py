"""``@locked`` and ``@single_flight`` for management commands and plain functions."""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.management.base import BaseCommand, CommandError

from ..exceptions import BackendUnavailable, LockLost, LockNotAcquired
from ._lock import Lock
from ._names import DEFAULT_NAMESPACE

logger = logging.getLogger("django_redispatterns.locks")

F = TypeVar("F", bound=Callable[..., Any])
NameT = str | Callable[..., str] | None

_current: contextvars.ContextVar[Lock | None] = contextvars.ContextVar(
    "django_redispatterns_current_lock", default=None
)


def current_lock() -> Lock | None:
    """The lock held by the innermost ``@locked``/``@single_flight`` around this code.

    Plain functions read their fencing token here: ``current_lock().fencing_token``.
    """
    return _current.get()


def _command_name(command: BaseCommand) -> str:
    return type(command).__module__.rsplit(".", 1)[-1]


def _lock_name(name: NameT, func: Callable[..., Any], command: BaseCommand | None,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if name is None:
        return _command_name(command) if command is not None else (
            f"{func.__module__}.{func.__qualname__}")
    if isinstance(name, str):
        return name
    derived = name(*(args[1:] if command is not None else args), **kwargs)
    if not isinstance(derived, str) or not derived:
        raise TypeError(f"the lock name callable {name!r} must return a non-empty str, "
                        f"got {derived!r}")
    return derived


def _decorate(func: F, *, name: NameT, ttl: float, wait: float, auto_renew: bool,
              namespace: str, skip: bool, max_hold: float | None) -> F:
    def make_lock(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Lock, Any]:
        command = args[0] if args and isinstance(args[0], BaseCommand) else None
        lock_name = _lock_name(name, func, command, args, kwargs)
        owner = _command_name(command) if command is not None else func.__qualname__
        lock = Lock(lock_name, ttl, wait=0 if skip else wait, auto_renew=auto_renew,
                    namespace=namespace, owner=owner, max_hold=max_hold)
        return lock, command

    def not_acquired(lock: Lock, command: BaseCommand | None) -> None:
        if skip:
            line = (f"skipped: {lock.name!r} is already running elsewhere "
                    "(@single_flight lock held)")
            # The line itself goes to stderr (once); the log record is DEBUG, so a console
            # log handler at INFO (a common Django setup) does not print it a second time.
            logger.debug(line)
            (command.stderr if command is not None else sys.stderr).write(line + "\n")
            return
        message = (f"{lock.name!r} is locked by another run; gave up after waiting "
                   f"{lock.wait:g}s (@locked)")
        if command is not None:
            raise CommandError(message)
        raise LockNotAcquired(message)

    def translate(exc: BaseException, command: BaseCommand | None) -> BaseException:
        # Commands get a CommandError (one clear line, non-zero exit); the cause stays chained.
        if command is None:
            return exc
        if isinstance(exc, LockLost):
            return CommandError(f"{exc} (the command's work may have overlapped another run)")
        return CommandError(str(exc))

    def enter(lock: Lock, command: BaseCommand | None) -> contextvars.Token[Lock | None]:
        if command is not None:
            command.lock = lock  # type: ignore[attr-defined]
            command.fencing_token = lock.fencing_token  # type: ignore[attr-defined]
        return _current.set(lock)

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            lock, command = make_lock(args, kwargs)
            try:
                acquired = await lock.aacquire()
            except BackendUnavailable as exc:
                raise translate(exc, command) from exc
            if not acquired:
                not_acquired(lock, command)
                return None
            reset = enter(lock, command)
            try:
                async with _Held(lock):
                    return await func(*args, **kwargs)
            except (LockLost, BackendUnavailable) as exc:
                raise translate(exc, command) from exc
            finally:
                _current.reset(reset)

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        lock, command = make_lock(args, kwargs)
        try:
            acquired = lock.acquire()
        except BackendUnavailable as exc:
            raise translate(exc, command) from exc
        if not acquired:
            not_acquired(lock, command)
            return None
        reset = enter(lock, command)
        try:
            with _Held(lock):
                return func(*args, **kwargs)
        except (LockLost, BackendUnavailable) as exc:
            raise translate(exc, command) from exc
        finally:
            _current.reset(reset)

    return cast(F, wrapper)


class _Held:
    """Leave an already acquired lock the way ``with Lock(...)`` would."""

    def __init__(self, lock: Lock) -> None:
        self.lock = lock

    def __enter__(self) -> Lock:
        return self.lock

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.lock._exit(exc)

    async def __aenter__(self) -> Lock:
        return self.lock

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.lock.__aexit__(exc_type, exc, tb)


def locked(name: NameT = None, ttl: float = 60, wait: float = 0, *, auto_renew: bool = True,
           namespace: str = DEFAULT_NAMESPACE, max_hold: float | None = None,
           ) -> Callable[[F], F]:
    """Run the decorated command ``handle`` (or function) only while holding a lock.

    ``name`` defaults to the command's name (``module.qualname`` for functions); a callable
    gets the call's arguments (without ``self`` for commands) and returns the name. When
    another run holds the lock, waits up to ``wait`` seconds, then raises ``CommandError``
    for commands and :class:`LockNotAcquired` for functions. Inside, ``self.fencing_token``
    (commands) or ``current_lock().fencing_token`` gives the fencing token. ``max_hold``
    bounds the whole run's hold (see :class:`Lock`): past it the lock is lost.
    """
    def decorator(func: F) -> F:
        return _decorate(func, name=name, ttl=ttl, wait=wait, auto_renew=auto_renew,
                         namespace=namespace, skip=False, max_hold=max_hold)
    return decorator


def single_flight(name: NameT = None, ttl: float = 60, *, auto_renew: bool = True,
                  namespace: str = DEFAULT_NAMESPACE, max_hold: float | None = None,
                  ) -> Callable[[F], F]:
    """At most one run at a time across every host; a concurrent run skips.

    A skipped run writes one line to stderr and returns None without running (a command
    exits with status 0). Redis being unreachable is not a skip: it raises (fail closed).
    """
    def decorator(func: F) -> F:
        return _decorate(func, name=name, ttl=ttl, wait=0, auto_renew=auto_renew,
                         namespace=namespace, skip=True, max_hold=max_hold)
    return decorator
