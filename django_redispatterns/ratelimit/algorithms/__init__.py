"""One module per algorithm, behind one small interface (:class:`Algorithm`).

Each algorithm is one Lua script that decides *and* reports in a single ``EVALSHA``. An
admitted hit (the common case) is answered with one integer, ``reset_ms * (capacity + 1) +
remaining`` (the capacity is known here already): the cheapest reply to build in Lua, to
send and to parse. A blocked hit, or a rate too large for that integer to be exact, is
answered with one short string, ``"<allowed> <remaining> <reset_ms> <retry_ms>"``.
:meth:`Algorithm.decision` turns either into a :class:`Decision`. Adding an algorithm means
one Lua file, one module with an :class:`Algorithm` subclass, and one line in
:data:`_REGISTRY`.
"""

from __future__ import annotations

import importlib

from ..rates import ALGORITHMS, validate_algorithm
from .base import Algorithm, Decision, whole_seconds

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


__all__ = ["Algorithm", "Decision", "get_algorithm", "whole_seconds"]
