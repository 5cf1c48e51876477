"""Rate strings and middleware rules: parsed strictly, rejected with the offending value.

``parse_rate("5/10s")`` -> ``Rate(limit=5, period=10)``. Accepted units: ``s``, ``m``,
``h``, ``d`` (also ``sec``/``second``, ``min``/``minute``, ``hour``, ``day`` and their
plurals), optionally preceded by a whole multiplier (``"100/15m"``). Anything else —
``"5/x"``, ``"0/m"``, ``"-1/s"``, ``"5 per minute"``, a float — raises
:class:`~django_redispatterns.exceptions.ConfigurationError` naming the value.

A rule's rate may also be a callable (``request -> rate string or None``, e.g. per user
tier) or, in settings, the dotted path of one: :func:`validate_rate_source` tells them
apart (a rate string always contains ``/``).

These functions are pure (no Redis, no settings), so the system checks can call them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError

ALGORITHMS = ("fixed_window", "sliding_window", "token_bucket")
DEFAULT_ALGORITHM = "fixed_window"
KEY_KINDS = ("ip", "user", "user_or_ip")
HEADER_KEY_PREFIX = "header:"

_UNITS: dict[str, int] = {}
for _names, _seconds in (
    (("s", "sec", "secs", "second", "seconds"), 1),
    (("m", "min", "mins", "minute", "minutes"), 60),
    (("h", "hr", "hour", "hours"), 3600),
    (("d", "day", "days"), 86400),
):
    for _name in _names:
        _UNITS[_name] = _seconds

_RATE_RE = re.compile(r"^\s*([0-9]+)\s*/\s*([0-9]*)\s*([a-z]+)\s*$")
_HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an RFC 9110 token
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
                      "CONNECT"})
# Largest period we accept (a year): bounds key TTLs and the Lua arithmetic.
MAX_PERIOD = 366 * 86400
MAX_LIMIT = 10**9


@dataclass(frozen=True)
class Rate:
    """``limit`` requests per ``period`` seconds."""

    limit: int
    period: int

    def __str__(self) -> str:
        return f"{self.limit}/{self.period}s"


def parse_rate(text: str) -> Rate:
    """Parse ``"<count>/[<multiplier>]<unit>"``; raise ``ConfigurationError`` naming ``text``."""
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ConfigurationError(
            f"rate must be a string such as '100/m' or '5/10s', got {type(text).__name__} "
            f"({text!r})."
        )
    match = _RATE_RE.match(text.lower())
    if match is None or match.group(3) not in _UNITS:
        raise ConfigurationError(
            f"invalid rate {text!r}: expected '<count>/<unit>' or '<count>/<n><unit>' with unit "
            "s, m, h or d (e.g. '100/m', '5/10s')."
        )
    count, multiplier, unit = match.groups()
    limit = int(count)
    period = int(multiplier or 1) * _UNITS[unit]
    if limit < 1 or limit > MAX_LIMIT:
        raise ConfigurationError(f"invalid rate {text!r}: the count must be 1..{MAX_LIMIT}.")
    if period < 1 or period > MAX_PERIOD:
        raise ConfigurationError(
            f"invalid rate {text!r}: the period must be between 1 second and 366 days."
        )
    return Rate(limit, period)


def is_rate_path(text: str) -> bool:
    """True for the dotted path of a rate callable (``"myapp.limits.tier_rate"``)."""
    return ("/" not in text and "." in text
            and all(part.isidentifier() for part in text.replace(":", ".").split(".")))


def validate_rate_source(rate: Any, *, where: str = "rate") -> None:
    """Accept a rate string, a ``Rate``, a callable or the dotted path of one."""
    if callable(rate) or isinstance(rate, Rate):
        return
    if isinstance(rate, str) and is_rate_path(rate):
        return
    try:
        parse_rate(rate)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}" if where != "rate" else str(exc)) from None


def validate_cost(cost: Any, capacity: int | None = None, *, where: str = "cost") -> int:
    """A rule's cost: a whole number from 1 to what the rate allows at once."""
    top = capacity if capacity is not None else MAX_LIMIT
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= top:
        allows = f" (the rate allows {capacity} at once)" if capacity is not None else ""
        raise ConfigurationError(
            f"{where} must be a whole number from 1 to {top}{allows}, got {cost!r}: a cost "
            "above what the rate allows could never be admitted."
        )
    return cost


def validate_algorithm(name: Any, *, where: str = "algorithm") -> str:
    """Return ``name`` if it is a known algorithm, else raise naming it."""
    if name not in ALGORITHMS:
        raise ConfigurationError(
            f"{where} {name!r} is not one of {', '.join(map(repr, ALGORITHMS))}."
        )
    return str(name)


def validate_key(key: Any, *, where: str = "key") -> None:
    """Accept ``ip``, ``user``, ``user_or_ip``, ``header:<Name>``, a callable or a dotted path."""
    if callable(key):
        return
    if not isinstance(key, str):
        raise ConfigurationError(f"{where} must be a string or a callable, got {key!r}.")
    if key in KEY_KINDS:
        return
    if key.startswith(HEADER_KEY_PREFIX):
        name = key[len(HEADER_KEY_PREFIX):]
        if not _HEADER_NAME_RE.match(name):
            raise ConfigurationError(f"{where} {key!r} names no valid HTTP header.")
        return
    if "." in key and all(part.isidentifier() for part in key.replace(":", ".").split(".")):
        return  # a dotted path to a callable, imported on first use
    raise ConfigurationError(
        f"{where} {key!r} must be 'ip', 'user', 'user_or_ip', 'header:<Name>', a callable "
        "or the dotted path of one."
    )


def validate_methods(methods: Any, *, where: str = "methods") -> frozenset[str] | None:
    """``None`` (all methods) or a set of upper-case HTTP method names."""
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, Iterable):
        raise ConfigurationError(f"{where} must be a list of HTTP methods, got {methods!r}.")
    result = set()
    for method in methods:
        if not isinstance(method, str) or method.upper() not in _METHODS:
            raise ConfigurationError(f"{where} contains {method!r}, which is no HTTP method.")
        result.add(method.upper())
    return frozenset(result)


def validate_burst(burst: Any, *, where: str = "burst") -> int | None:
    if burst is None:
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1 or burst > MAX_LIMIT:
        raise ConfigurationError(f"{where} must be a positive integer, got {burst!r}.")
    return burst


RULE_KEYS = frozenset({"path", "rate", "key", "algorithm", "methods", "burst", "name",
                       "group", "cost", "shadow"})


def validate_rule(rule: Any, *, where: str = "rule") -> None:
    """Raise ``ConfigurationError`` naming the bad entry of one middleware rule."""
    if not isinstance(rule, Mapping):
        raise ConfigurationError(f"{where} must be a dict, got {type(rule).__name__}.")
    unknown = sorted(set(rule) - RULE_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys are {', '.join(sorted(RULE_KEYS))}."
        )
    if "rate" not in rule:
        raise ConfigurationError(f"{where} needs a 'rate', e.g. '100/m'.")
    validate_rate_source(rule["rate"], where=f"{where}['rate']")
    path = rule.get("path", "")
    if not isinstance(path, str):
        raise ConfigurationError(f"{where}['path'] must be a regex string, got {path!r}.")
    try:
        re.compile(path)
    except re.error as exc:
        raise ConfigurationError(f"{where}['path'] {path!r} is no valid regex: {exc}.") from None
    validate_algorithm(rule.get("algorithm", DEFAULT_ALGORITHM), where=f"{where}['algorithm']")
    validate_key(rule.get("key", "ip"), where=f"{where}['key']")
    validate_methods(rule.get("methods"), where=f"{where}['methods']")
    validate_burst(rule.get("burst"), where=f"{where}['burst']")
    if rule.get("burst") is not None and rule.get("algorithm") != "token_bucket":
        raise ConfigurationError(f"{where}['burst'] only applies to algorithm 'token_bucket'.")
    for text_key in ("name", "group"):
        value = rule.get(text_key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigurationError(f"{where}[{text_key!r}] must be a non-empty string.")
    if "cost" in rule:
        rate = rule["rate"]
        capacity = None
        if isinstance(rate, str) and not is_rate_path(rate):
            capacity = rule.get("burst") or parse_rate(rate).limit
        validate_cost(rule["cost"], capacity, where=f"{where}['cost']")
    if not isinstance(rule.get("shadow", False), bool):
        raise ConfigurationError(f"{where}['shadow'] must be True or False.")


def validate_rules(rules: Any) -> None:
    """Validate ``REDIS_PATTERNS['RATELIMIT']['RULES']``; raise ``ConfigurationError``."""
    if not isinstance(rules, (list, tuple)):
        raise ConfigurationError(
            f"REDIS_PATTERNS['RATELIMIT']['RULES'] must be a list, got {type(rules).__name__}."
        )
    for i, rule in enumerate(rules):
        validate_rule(rule, where=f"REDIS_PATTERNS['RATELIMIT']['RULES'][{i}]")


KeyFunc = Callable[[Any], str]
