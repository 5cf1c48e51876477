"""One module per algorithm, behind one small interface (:class:`Algorithm`).

Each algorithm is one Lua script that decides *and* reports in a single ``EVALSHA``:
the script answers ``{allowed, limit, remaining, reset_after_ms, retry_after_ms}``, which
:meth:`Algorithm.decision` turns into a :class:`Decision`. Adding an algorithm means one
Lua file, one module with an :class:`Algorithm` subclass, and one line in :data:`_REGISTRY`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from ...exceptions import ConfigurationError, ScriptError
from ...scripts import ArgT, LuaScript, script
from ..rates import ALGORITHMS, Rate, validate_algorithm


class Decision(NamedTuple):
    """The outcome of one rate-limit check (a named tuple: cheap on the hot path).

    ``reset_after`` and ``retry_after`` are seconds (floats, from the Redis server clock);
    ``retry_after`` is 0 when ``allowed``. ``policy`` is the rule's rate (``Rate``) and
    ``name`` the policy name used in the ``RateLimit`` headers. ``bool(decision)`` is
    ``decision.allowed``.
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    policy: Rate | None = None
    name: str = "default"

    @property
    def reset(self) -> float:
        """Alias of ``reset_after`` (seconds until the quota resets)."""
        return self.reset_after

    def __bool__(self) -> bool:
        return self.allowed


class Algorithm:
    """One rate-limit strategy: a Lua script plus how to call it and read its answer."""

    name: ClassVar[str]
    code: ClassVar[str]  # short tag used in key names
    script_name: ClassVar[str]
    # Takes a per-hit request id (ARGV): the sliding window's log member. The other
    # scripts are not idempotent and run on a client that never re-sends (SPEC D4).
    uses_request_id: ClassVar[bool] = False

    def __init__(self, rate: Rate, burst: int | None = None) -> None:
        if burst is not None:
            raise ConfigurationError(f"burst= only applies to token_bucket, not {self.name}.")
        self.rate = rate

    @property
    def lua(self) -> LuaScript:
        return script(self.script_name)

    @property
    def shape(self) -> str:
        """Part of the key name: rules with different rates never share a counter."""
        return f"{self.rate.limit}-{self.rate.period}"

    def args(self, cost: int, request_id: str) -> Sequence[ArgT]:
        return (self.rate.limit, self.rate.period * 1000, cost)

    def decision(self, raw: Any, name: str = "default") -> Decision:
        try:
            allowed, limit, remaining, reset_ms, retry_ms = raw
            # A blocked answer always carries a positive wait (Retry-After is >= 1 s anyway).
            retry = 0.0 if allowed else max(retry_ms / 1000.0, 0.001)
            return Decision(allowed == 1, limit, remaining if remaining > 0 else 0,
                            reset_ms / 1000.0 if reset_ms > 0 else 0.0, retry, self.rate, name)
        except (TypeError, ValueError) as exc:
            raise ScriptError(f"{self.script_name} answered {raw!r}") from exc


_REGISTRY = {
    "fixed_window": ".fixed_window:FixedWindow",
    "sliding_window": ".sliding_window:SlidingWindow",
    "token_bucket": ".token_bucket:TokenBucket",
}
assert tuple(_REGISTRY) == ALGORITHMS


def get_algorithm(name: str) -> type[Algorithm]:
    """The :class:`Algorithm` subclass registered as ``name``."""
    validate_algorithm(name)
    module, _, cls = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module, __name__), cls)


def whole_seconds(seconds: float) -> int:
    """Header value for a duration: whole seconds, rounded up."""
    return max(math.ceil(seconds - 1e-9), 0)


__all__ = ["Algorithm", "Decision", "get_algorithm", "whole_seconds"]
