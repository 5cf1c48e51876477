"""``@ratelimit``: limit one view (sync or async), django-ratelimit style.

::

    @ratelimit(rate="5/m", key="ip", algorithm="sliding_window", methods=["POST"])
    def login_view(request): ...

Counters are grouped per view (``group`` defaults to the view's dotted name); stack the
decorator for several limits. Bad arguments raise ``ConfigurationError`` at import time.
The wrapped view carries its rules as ``view.ratelimit_rules`` (what ``manage.py
ratelimit --view`` reads to address exactly the decorator's keys).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from .engine import acheck, add_headers, check
from .rates import DEFAULT_ALGORITHM
from .rules import RateSource, Rule

V = TypeVar("V", bound=Callable[..., Any])

RULES_ATTR = "ratelimit_rules"


def ratelimit(
    rate: RateSource,
    key: str | Callable[[Any], Any] = "ip",
    algorithm: str = DEFAULT_ALGORITHM,
    methods: Any = None,
    *,
    burst: int | None = None,
    group: str | None = None,
    name: str | None = None,
    cost: int = 1,
    block: bool = True,
    shadow: bool = False,
) -> Callable[[V], V]:
    """Limit a view to ``rate`` per identity ``key``.

    ``rate`` is a rate string or a callable ``request -> rate string or None`` (``None``:
    this request is not limited), e.g. per user tier. Blocked requests get a 429 (or
    ``RATELIMIT['VIEW']``'s response) with ``Retry-After``; with ``block=False`` the view
    runs and sees ``request.limited``. ``shadow=True`` counts, logs and signals what the
    rule would block but never blocks (a new limit's trial run). Every response carries
    the rate-limit headers and the view sees ``request.ratelimit`` (a ``Decision``).
    ``methods`` restricts the rule to some HTTP methods (default: all); ``cost`` is how
    many units one request takes (1..what the rate allows at once).
    """
    options: dict[str, Any] = dict(rate=rate, key=key, algorithm=algorithm, methods=methods,
                                   burst=burst, name=name, cost=cost, block=block,
                                   shadow=shadow)
    # Fail at import time, naming the bad value, not on the first request.
    Rule(group=group or "ratelimit", **options)

    def decorator(view: V) -> V:
        rule = Rule(group=group or f"{view.__module__}.{view.__qualname__}",
                    auto_group=group is None, **options)
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
            wrapper: Any = async_wrapper
        else:

            @functools.wraps(view)
            def sync_wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
                request = _request(first, args)
                blocked = check(request, rules)
                if blocked is not None:
                    return blocked
                return add_headers(request, view(first, *args, **kwargs))

            wrapper = sync_wrapper
        # Stacked decorators: the outer wrapper lists every rule, innermost last.
        setattr(wrapper, RULES_ATTR, (rule, *getattr(view, RULES_ATTR, ())))
        return wrapper

    return decorator


def _request(first: Any, args: tuple[Any, ...]) -> Any:
    # Plain function views get the request first; a method decorated without
    # method_decorator gets (self, request, ...).
    if hasattr(first, "META"):
        return first
    return args[0]
