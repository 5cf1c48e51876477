"""The interface every algorithm implements (:class:`Algorithm`), the :class:`Decision` it
returns, and the header rounding they share; the package registers the algorithms."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from ...exceptions import ConfigurationError, ScriptError
from ...scripts import ArgT, LuaScript, script
from ..rates import Rate


class Decision(NamedTuple):
    """The outcome of one rate-limit check (a named tuple: cheap on the hot path).

    ``reset_after`` is the number of seconds until more quota becomes available (the
    window ends, the oldest logged hit leaves the window, the next token arrives);
    ``retry_after`` the seconds until a blocked hit would be admitted (0 when
    ``allowed``), never earlier than ``reset_after``. Both are floats from the Redis
    server clock. ``policy`` is the rule's rate and ``name`` its policy name in the
    headers; ``cost`` the units this hit counted (or tried to); ``partition`` the
    ``pk`` of the headers (a keyed hash of the identity, never the identity).

    ``decided`` is False when Redis could not answer and the request was let through
    (``FAIL_OPEN``): then ``allowed`` is True and ``remaining``/``reset_after`` are
    ``None`` — nothing was counted, so no count is claimed.

    ``bool(decision)`` is ``decision.allowed``.
    """

    allowed: bool
    limit: int
    remaining: int | None
    reset_after: float | None
    retry_after: float
    policy: Rate | None = None
    name: str = "default"
    decided: bool = True
    cost: int = 1
    partition: str = ""

    @property
    def reset(self) -> float | None:
        """Alias of ``reset_after`` (seconds until more quota becomes available)."""
        return self.reset_after

    def __bool__(self) -> bool:
        return self.allowed

    @classmethod
    def undecided(cls, limiter: Any, cost: int = 1) -> Decision:
        """The decision recorded when Redis could not answer for ``limiter``: allowed,
        marked not decided, no counts."""
        return cls(True, limiter.algorithm.capacity, None, None, 0.0, limiter.rate,
                   limiter.name, False, cost)


_new_tuple = tuple.__new__  # builds a Decision without NamedTuple's Python-level __new__


class Algorithm:
    """One rate-limit strategy: a Lua script plus how to call it and read its answer."""

    name: ClassVar[str]
    code: ClassVar[str]  # short tag used in key names
    script_name: ClassVar[str]
    # Takes a per-hit request id (ARGV): the sliding window's log member. The other
    # scripts are not idempotent and run on a client that never re-sends a call.
    uses_request_id: ClassVar[bool] = False

    def __init__(self, rate: Rate, burst: int | None = None) -> None:
        if burst is not None:
            raise ConfigurationError(f"burst= only applies to token_bucket, not {self.name}.")
        self.rate = rate
        self.lua: LuaScript = script(self.script_name)
        # Arguments are sent as ready bytes: no int formatting per call. A cost of 1 (the
        # common case) is not sent: the scripts read an absent cost as 1.
        self._fixed = tuple(str(a).encode() for a in self.fixed_args())
        self._args_by_cost = {0: (*self._fixed, b"0"), 1: self._fixed}
        self._capacity = self.capacity
        self._base = self._capacity + 1  # the packing of an admitted answer

    @property
    def capacity(self) -> int:
        """The most one identity can spend at once (the limit; a token bucket's burst)."""
        return self.rate.limit

    @property
    def shape(self) -> str:
        """Part of the key name: rules with different rates never share a counter."""
        return f"{self.rate.limit}-{self.rate.period}"

    def fixed_args(self) -> tuple[int, ...]:
        """The script's arguments before the cost (the same for every hit)."""
        return (self.rate.limit, self.rate.period * 1000)

    def args(self, cost: int, request_id: str) -> Sequence[ArgT]:
        args = self._args_by_cost.get(cost)
        return args if args is not None else (*self._fixed, str(cost).encode())

    def decision(self, raw: Any, name: str = "default", cost: int = 1,
                 partition: str = "") -> Decision:
        if raw.__class__ is int:  # admitted: reset_ms * (capacity + 1) + remaining
            reset_ms, remaining = divmod(raw, self._base)
            return _new_tuple(Decision, (True, self._capacity, remaining, reset_ms / 1000.0,
                                         0.0, self.rate, name, True, cost, partition))
        try:
            allowed, remaining, reset_ms, retry_ms = raw.split()
            if allowed == b"1" or allowed == "1":
                return _new_tuple(Decision, (True, self._capacity, int(remaining),
                                             int(reset_ms) / 1000.0, 0.0, self.rate, name,
                                             True, cost, partition))
            # A blocked answer always carries a positive wait (Retry-After is >= 1 s).
            return Decision(False, self._capacity, int(remaining), int(reset_ms) / 1000.0,
                            max(int(retry_ms) / 1000.0, 0.001), self.rate, name, True, cost,
                            partition)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ScriptError(f"{self.script_name} answered {raw!r}") from exc


def whole_seconds(seconds: float) -> int:
    """Header value for a duration: whole seconds, rounded up."""
    return max(math.ceil(seconds - 1e-9), 0)
