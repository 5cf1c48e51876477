"""``@ratelimit``: limit one view (sync or async), django-ratelimit style.

::

    @ratelimit(rate="5/m", key="ip", algorithm="sliding_window", methods=["POST"])
    def login_view(request): ...

Counters are grouped per view (``group`` defaults to the view's dotted name); stack the
decorator for several limits. Bad arguments raise ``ConfigurationError`` at import time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..exceptions import ConfigurationError
from .engine import Rule, acheck, add_headers, check
from .rates import DEFAULT_ALGORITHM, parse_rate, validate_algorithm, validate_key, validate_methods

V = TypeVar("V", bound=Callable[..., Any])


def ratelimit(
    rate: str,
    key: str | Callable[[Any], Any] = "ip",
    algorithm: str = DEFAULT_ALGORITHM,
    methods: Any = None,
    *,
    burst: int | None = None,
    group: str | None = None,
    name: str | None = None,
    cost: int = 1,
    block: bool = True,
) -> Callable[[V], V]:
    """Limit a view to ``rate`` per identity ``key``.

    Blocked requests get a 429 (or ``RATELIMIT['VIEW']``'s response) with ``Retry-After``;
    with ``block=False`` the view runs and sees ``request.limited``. Every response carries
    the rate-limit headers and the view sees ``request.ratelimit`` (a ``Decision``).
    ``methods`` restricts the rule to some HTTP methods (default: all).
    """

    # Fail at import time, naming the bad value, not on the first request.
    parse_rate(rate)
    validate_algorithm(algorithm)
    validate_key(key)
    validate_methods(methods)
    if burst is not None and algorithm != "token_bucket":
        raise ConfigurationError("burst= only applies to algorithm='token_bucket'.")

    def decorator(view: V) -> V:
        rule = Rule.build(
            rate=rate, key=key, algorithm=algorithm, methods=methods, burst=burst,
            group=group or f"{view.__module__}.{view.__qualname__}", name=name, cost=cost,
            block=block,
        )
        rules = (rule,)

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
                request = _request(first, args)
                blocked = await acheck(request, rules)
                if blocked is not None:
                    return blocked
                return add_headers(request, await view(first, *args, **kwargs))

            markcoroutinefunction(async_wrapper)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
            request = _request(first, args)
            blocked = check(request, rules)
            if blocked is not None:
                return blocked
            return add_headers(request, view(first, *args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return decorator


def _request(first: Any, args: tuple[Any, ...]) -> Any:
    # Plain function views get the request first; a method decorated without
    # method_decorator gets (self, request, ...).
    if hasattr(first, "META"):
        return first
    return args[0]
