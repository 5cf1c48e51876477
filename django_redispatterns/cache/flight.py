"""``get_or_set`` past a plain hit: the single-flight flow (:mod:`.stampede`) driven
against Redis, sync and async.

The driver sends each operation the flow yields (:mod:`.ops` / :mod:`.aops`), runs the
callable when the flow says ``compute`` (with :mod:`.renewal` extending the claim
meanwhile), and applies the failure policy: a Redis error before the value is known
degrades per ``IGNORE_EXCEPTIONS`` (the callable's value, or the redis-py exception, which
every caller of this process sharing the attempt gets at once); once the callable ran,
its value is returned even if storing it fails. The callable's own exception releases the
lock at once and reaches only the caller that ran it.

The driver is written once, as a coroutine over an :class:`_IO` (how to send an operation
and how to run the callable). ``aget_or_set`` awaits it; ``get_or_set`` runs it with
:func:`_run_sync`, which needs no event loop because the sync :class:`_IO` never suspends.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

from . import aops, renewal, stampede
from .coalesce import Coalescer, SharedFailure, aalone, alone
from .codec import MISSING, Codec
from .failures import REDIS_ERRORS
from .ops import RedisOps
from .options import Policy

logger = logging.getLogger("django_redispatterns.cache")

Degrade = Callable[[str, BaseException, Any], Any]
T = TypeVar("T")


def value_of(default: Any) -> Any:
    """``get_or_set``'s ``default``: called when callable, as Django does."""
    return default() if callable(default) else default


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class SingleFlight:
    """The miss path of one backend's ``get_or_set`` / ``aget_or_set``.

    ``seen`` is what the caller's read found: ``None`` for a miss (coalesced with the other
    missers of this process), or the bytes and metadata of a stale or early-refreshing
    entry (straight to the flow: such a caller never waits for this process's others).
    ``scope`` names the server in the in-process flight key. Claims are renewed on
    ``ops`` (the sync client) for async callers too.
    """

    def __init__(self, codec: Codec, ops: RedisOps, policy: Policy,
                 report: stampede.Reporter, degrade: Degrade, scope: str) -> None:
        self._codec = codec
        self._ops = ops
        self.policy = policy
        self._report = report
        self._degrade = degrade
        self._scope = scope
        self._coalescer = Coalescer(policy.max_wait, report, codec.copy)

    def _flow(self, key: Any, ttl: float | None, nkey: str, seen: stampede.Seen | None,
              waited: float) -> stampede.Flow:
        return stampede.get_or_set_flow(self._codec, self._report, key, ttl, nkey,
                                        self.policy, seen, waited)

    def miss(self, key: Any, nkey: str, ttl: float | None, default: Any,
             seen: stampede.Seen | None) -> Any:
        io = _SyncIO(self._ops, default)

        def attempt(waited: float) -> Any:
            return _run_sync(self._drive(io, self._flow(key, ttl, nkey, seen, waited)))

        if seen is not None:  # stale, or XFetch picked us: through the flow, no waiting
            return alone(attempt)
        return self._coalescer.run(key, (self._scope, nkey), attempt)

    async def amiss(self, aclient: Any, key: Any, nkey: str, ttl: float | None, default: Any,
                    seen: stampede.Seen | None) -> Any:
        io = _AsyncIO(aclient, default)

        async def attempt(waited: float) -> Any:
            return await self._drive(io, self._flow(key, ttl, nkey, seen, waited))

        if seen is not None:
            return await aalone(attempt)
        return await self._coalescer.arun(key, (self._scope, nkey), attempt)

    async def _drive(self, io: _IO, flow: stampede.Flow) -> Any:
        reply: Any = None
        computed: Any = MISSING
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return stop.value
            kind = op[0]
            if kind == "compute":
                try:
                    computed = await self._compute(io, op[1])
                except BaseException as exc:
                    await _release_quietly(io, _op_after_throw(flow, exc))
                    _finish_after_release(flow, exc)
                reply = computed
                continue
            try:
                reply = await io.run(op)
            except REDIS_ERRORS as exc:
                reply = None
                if self._goes_on_after(kind, exc, flow):
                    continue
                return (await io.compute()) if computed is MISSING else computed

    def _goes_on_after(self, kind: str, exc: BaseException, flow: stampede.Flow) -> bool:
        """Redis failed on operation ``kind``. A failed store is logged and the flow goes on
        (its caller still gets the value). Otherwise the flow ends here and the failure
        policy decides: with IGNORE_EXCEPTIONS the caller computes (False); without, the
        error is raised, shared with every caller waiting for this attempt."""
        if kind == "settle":
            logger.warning("cache: storing a computed value failed: %s", exc)
            return True
        flow.close()
        try:
            self._degrade("get_or_set", exc, None)
        except BaseException as error:
            raise SharedFailure(error) from error
        return False

    async def _compute(self, io: _IO, renew: stampede.Op | None) -> Any:
        """Run the callable; while it runs, extend our claim with the flow's ``renew``
        operation (None: we compute without holding the claim)."""
        beat = self._renewing(renew) if renew is not None else None
        try:
            return await io.compute()
        finally:
            if beat is not None:
                beat.stop()

    def _renewing(self, op: stampede.Op) -> renewal.Beat:
        ops, nkey = self._ops, op[1][0]

        def renew() -> bool:
            try:
                extended = int(ops.run(op))
            except REDIS_ERRORS as exc:
                logger.warning("cache key %r: extending the compute claim failed: %s "
                               "(trying again)", nkey, exc)
                return True
            if extended == 0:
                logger.warning("cache key %r: the compute claim was lost while computing; "
                               "another caller may compute it too", nkey)
            elif extended < 0:
                logger.warning("cache key %r: still computing after STAMPEDE_LEASE; the "
                               "claim ends and another caller may compute it too", nkey)
            return extended == 1

        return renewal.start(renew, self.policy.renew_every)


class _IO(Protocol):
    async def run(self, op: stampede.Op) -> Any: ...
    async def compute(self) -> Any: ...


class _SyncIO:
    """Blocking calls behind ``async def``: awaiting them never suspends."""

    def __init__(self, ops: RedisOps, default: Any) -> None:
        self._ops = ops
        self._default = default

    async def run(self, op: stampede.Op) -> Any:
        return self._ops.run(op)

    async def compute(self) -> Any:
        return value_of(self._default)


class _AsyncIO:
    def __init__(self, aclient: Any, default: Any) -> None:
        self._aclient = aclient
        self._default = default

    async def run(self, op: stampede.Op) -> Any:
        return await aops.run(self._aclient, op)

    async def compute(self) -> Any:
        return await maybe_await(value_of(self._default))


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the driver over :class:`_SyncIO`)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return cast(T, stop.value)
    coro.close()
    raise RuntimeError("the sync get_or_set driver suspended")  # pragma: no cover


async def _release_quietly(io: _IO, op: stampede.Op | None) -> None:
    if op is None:
        return
    try:
        await io.run(op)
    except REDIS_ERRORS as exc:
        logger.warning("cache: releasing a compute lock failed: %s", exc)


def _op_after_throw(flow: stampede.Flow, exc: BaseException) -> stampede.Op | None:
    """Throw the callable's exception into the flow; return the release it yields."""
    try:
        return flow.throw(exc)
    except StopIteration:  # pragma: no cover - the flow always re-raises
        return None


def _finish_after_release(flow: stampede.Flow, exc: BaseException) -> None:
    """Resume the flow after its release: it re-raises the callable's exception."""
    with contextlib.suppress(StopIteration):
        flow.send(None)
    raise exc  # pragma: no cover - flow.send re-raised it already
