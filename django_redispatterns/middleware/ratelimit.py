"""``RateLimitMiddleware``: apply ``REDIS_PATTERNS['RATELIMIT']['RULES']`` to every request.

Every rule whose ``path`` regex matches (``re.search`` on ``path_info``) and whose
``methods`` include the request's method is decided — all of them in one pipelined round
trip — and the request is blocked if any enforcing rule blocks it (``shadow`` rules only
count, log and signal). Counters are grouped per rule (``group`` lets several rules share
one). Works under WSGI and ASGI: on an async stack it uses ``redis.asyncio`` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..conf import get_config
from ..ratelimit.engine import Rule, acheck, add_headers, check, validate_section
from ..ratelimit.rates import DEFAULT_ALGORITHM, validate_rules


def rule_group(entry: Mapping[str, Any], index: int) -> str:
    """The counter group of ``RULES[index]``: its ``group``, else its ``name``, else its
    index and path."""
    return entry.get("group") or entry.get("name") or f"rule:{index}:{entry.get('path', '')}"


def compile_rules(rules: Sequence[Mapping[str, Any]]) -> tuple[Rule, ...]:
    """Validated settings rules -> :class:`Rule` objects (grouped per rule by default)."""
    validate_rules(rules)
    compiled = []
    for i, entry in enumerate(rules):
        compiled.append(Rule(
            rate=entry["rate"], key=entry.get("key", "ip"),
            algorithm=entry.get("algorithm", DEFAULT_ALGORITHM), methods=entry.get("methods"),
            burst=entry.get("burst"), path=entry.get("path") or None, group=rule_group(entry, i),
            name=entry.get("name"), cost=entry.get("cost", 1),
            shadow=entry.get("shadow", False),
        ))
    return tuple(compiled)


class RateLimitMiddleware:
    """Thin adapter from settings rules to :func:`~..ratelimit.engine.check`."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[..., Any]) -> None:
        self.get_response = get_response
        self._section: Any = None
        self._rules: tuple[Rule, ...] = ()
        self.rules()  # bad RULES fail at startup, naming the value
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def rules(self) -> tuple[Rule, ...]:
        section = get_config().feature("RATELIMIT")
        if section is not self._section:  # settings changed (override_settings)
            self._rules = compile_rules(section["RULES"])
            validate_section(section)
            self._section = section
        return self._rules

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self.__acall__(request)
        blocked = check(request, self.rules())
        if blocked is not None:
            return blocked
        return add_headers(request, self.get_response(request))

    async def __acall__(self, request: Any) -> Any:
        blocked = await acheck(request, self.rules())
        if blocked is not None:
            return blocked
        return add_headers(request, await self.get_response(request))
