"""A :class:`Rule`: which requests a limit covers, who is counted, and at what rate.

The decorator, the middleware and the DRF throttle all build rules here; the engine
decides them. A rule's rate is a string (``"5/m"``) or a callable ``request -> rate or
None`` (a per-tier rate; ``None`` means "not limited"), also accepted as a dotted path.
A callable may also take django-ratelimit's ``(group, request)``. The limiter of each
rate a callable returns is built once and kept (up to :data:`MAX_RATES_PER_RULE` per
rule): a tier's counters are keyed by its rate, so a client moving to another tier starts
that tier's budget afresh.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from ..exceptions import ConfigurationError
from .identity import KeyFunc, resolve_key
from .limiter import RateLimiter
from .rates import (
    DEFAULT_ALGORITHM,
    Rate,
    is_rate_path,
    parse_rate,
    validate_algorithm,
    validate_burst,
    validate_cost,
    validate_methods,
    validate_rate_source,
)

MAX_RATES_PER_RULE = 64

RateSource = str | Rate | Callable[..., Any]


class Rule:
    """One limit applied to requests: a limiter (or a rate per request), who is counted
    (``key``), which requests it covers (``methods``, ``path``) and what it does."""

    __slots__ = (
        "_limiters",
        "_lock",
        "_rate_fn",
        "algorithm",
        "auto_group",
        "block",
        "burst",
        "connection",
        "cost",
        "group",
        "key",
        "key_spec",
        "limiter",
        "methods",
        "name",
        "path",
        "shadow",
    )

    def __init__(self, *, rate: RateSource, key: str | Callable[[Any], Any] = "ip",
                 algorithm: str = DEFAULT_ALGORITHM, methods: Any = None,
                 burst: int | None = None, group: str, name: str | None = None,
                 path: str | None = None, cost: int = 1, block: bool = True,
                 shadow: bool = False, connection: str | None = None,
                 auto_group: bool = False) -> None:
        validate_rate_source(rate)
        self.algorithm = validate_algorithm(algorithm)
        self.burst = validate_burst(burst)
        if burst is not None and algorithm != "token_bucket":
            raise ConfigurationError("burst= only applies to algorithm='token_bucket'.")
        if not isinstance(shadow, bool) or not isinstance(block, bool):
            raise ConfigurationError("block= and shadow= must be True or False.")
        self.key: KeyFunc = resolve_key(key)
        self.key_spec = key if isinstance(key, str) else "callable"
        self.methods = validate_methods(methods)
        self.path = re.compile(path) if path else None
        self.block, self.shadow = block, shadow
        self.group, self.name, self.connection = group, name, connection
        self.auto_group = auto_group  # group derived from the view's name, not given
        self._limiters: dict[Rate, RateLimiter] = {}
        self._lock = threading.Lock()
        self._rate_fn: Callable[[Any], Any] | None = None
        self.limiter: RateLimiter | None = None
        if isinstance(rate, str) and is_rate_path(rate):
            rate = _import_rate(rate)
        if callable(rate):
            validate_cost(cost)
            self._rate_fn = _request_only(rate, group)
        else:
            self.limiter = self._build(rate if isinstance(rate, Rate) else parse_rate(rate))
            validate_cost(cost, self.limiter.algorithm.capacity)
        self.cost = cost

    @classmethod
    def build(cls, **options: Any) -> Rule:
        """Same as ``Rule(...)`` (kept for callers of the earlier factory)."""
        return cls(**options)

    def __repr__(self) -> str:
        return f"<Rule {self.label(self.limiter)}>"

    def label(self, limiter: RateLimiter | None) -> str:
        """What logs and signals call this rule: group, rate, algorithm (no identity)."""
        rate = limiter.rate if limiter is not None else "callable rate"
        return f"{self.group} {rate} {self.algorithm}"

    @property
    def rate_is_callable(self) -> bool:
        return self._rate_fn is not None

    def applies(self, request: Any) -> bool:
        if self.methods is not None and request.method not in self.methods:
            return False
        return self.path is None or self.path.search(request.path_info) is not None

    def limiter_for(self, request: Any) -> RateLimiter | None:
        """This request's limiter; ``None`` when a callable rate says "not limited"."""
        if self._rate_fn is None:
            return self.limiter
        value = self._rate_fn(request)
        if value is None or value == "":
            return None
        try:
            rate = value if isinstance(value, Rate) else parse_rate(value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"the rate callable of {self.group!r} returned "
                                     f"{value!r}: {exc}") from None
        return self.limiter_at(rate)

    def limiter_at(self, rate: Rate) -> RateLimiter:
        """The limiter of this rule at ``rate`` (built once per rate)."""
        if self.limiter is not None and self.limiter.rate == rate:
            return self.limiter
        limiter = self._limiters.get(rate)
        if limiter is None:
            limiter = self._build(rate)
            validate_cost(self.cost, limiter.algorithm.capacity,
                          where=f"the cost of {self.group!r} at {rate}")
            with self._lock:
                if len(self._limiters) < MAX_RATES_PER_RULE:
                    self._limiters.setdefault(rate, limiter)
        return limiter

    def _build(self, rate: Rate) -> RateLimiter:
        return RateLimiter(rate, algorithm=self.algorithm, burst=self.burst, group=self.group,
                           name=self.name, connection=self.connection)


def _import_rate(path: str) -> Callable[..., Any]:
    try:
        func = import_string(path.replace(":", "."))
    except ImportError as exc:
        raise ConfigurationError(f"rate {path!r} cannot be imported: {exc}") from exc
    if not callable(func):
        raise ConfigurationError(f"rate {path!r} is not callable.")
    return func


def _request_only(func: Callable[..., Any], group: str) -> Callable[[Any], Any]:
    """``request -> rate``; django-ratelimit's ``(group, request)`` callables are adapted."""
    try:
        params = [p for p in inspect.signature(func).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    except (TypeError, ValueError):
        return func
    if len(params) >= 2:
        return lambda request: func(group, request)
    return func
