"""One view's effective settings: ``REDIS_PATTERNS['IDEMPOTENCY']`` merged with the
decorator's overrides, validated once and cached per settings object."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from importlib import import_module
from inspect import iscoroutinefunction
from typing import Any, cast

from django.http import HttpRequest

from ..conf import get_config
from ..exceptions import ConfigurationError
from .store import IdempotencyStore

ScopeFunc = Callable[[HttpRequest], "str | None"]
AsyncScopeFunc = Callable[[HttpRequest], Awaitable["str | None"]]
Overrides = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Options:
    """One view's effective settings: ``IDEMPOTENCY`` merged with decorator overrides."""

    header: str
    meta_name: str
    ttl: float
    lease: float
    max_lease: float
    methods: frozenset[str]
    required: bool
    max_body_bytes: int
    scope: ScopeFunc | None  # None: user id, else session key
    store: IdempotencyStore

    def covers(self, method: str | None) -> bool:
        return method is not None and method.upper() in self.methods

    @functools.cached_property
    def scope_is_async(self) -> bool:
        return iscoroutinefunction(self.scope)


def _meta_name(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


@functools.lru_cache(maxsize=16)  # keyed by the Config object: settings changes make a new one
def _options_for(config: Any) -> Options:
    section = config.feature("IDEMPOTENCY")
    _validate(section)
    scope = section["SCOPE"]
    return Options(
        header=section["HEADER"],
        meta_name=_meta_name(section["HEADER"]),
        ttl=float(section["TTL"]),
        lease=float(section["LEASE"]),
        max_lease=float(section["MAX_LEASE"]),
        methods=frozenset(m.upper() for m in section["METHODS"]),
        required=section["REQUIRED"],
        max_body_bytes=section["MAX_BODY_BYTES"],
        scope=_import_scope(scope) if scope else None,
        store=IdempotencyStore(config.connection_for("IDEMPOTENCY")),
    )


def _validate(section: Any) -> None:
    where = "REDIS_PATTERNS['IDEMPOTENCY']"
    methods = section["METHODS"]
    if not all(isinstance(m, str) and m.isalpha() for m in methods):
        raise ConfigurationError(f"{where}['METHODS'] must list HTTP method names, got "
                                 f"{methods!r}.")
    if not re.fullmatch(r"[A-Za-z0-9-]+", section["HEADER"]):
        raise ConfigurationError(f"{where}['HEADER'] must be a header name, got "
                                 f"{section['HEADER']!r}.")
    if section["MAX_BODY_BYTES"] < 0:
        raise ConfigurationError(f"{where}['MAX_BODY_BYTES'] must be >= 0.")
    _check_max_lease(section["LEASE"], section["MAX_LEASE"], f"{where}['MAX_LEASE']")


def _check_max_lease(lease: float, max_lease: float, where: str) -> None:
    if max_lease < lease:
        raise ConfigurationError(f"{where} ({max_lease!r} s) must be at least the lease "
                                 f"({lease!r} s): a claim lives one lease before any renewal.")


def _import_scope(path: str) -> ScopeFunc:
    module, _, name = path.rpartition(".")
    try:
        return cast(ScopeFunc, getattr(import_module(module), name))
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"REDIS_PATTERNS['IDEMPOTENCY']['SCOPE'] = {path!r} cannot be imported: {exc}"
        ) from exc


def options(**overrides: Any) -> Options:
    """The settings in force now, with ``overrides`` (non-None values) applied."""
    return current(validated_overrides(overrides) if overrides else ())


def validated_overrides(given: dict[str, Any]) -> Overrides:
    """Validated decorator arguments (None means "use the setting"), sorted by name: made
    once per decorated view, they key the cache of its effective :class:`Options`."""
    out = {k: v for k, v in given.items() if v is not None}
    if "methods" in out:
        out["methods"] = frozenset(m.upper() for m in out["methods"])
    for name in ("ttl", "lease", "max_lease", "max_body_bytes"):
        if name in out and not (isinstance(out[name], (int, float)) and out[name] > 0):
            raise ConfigurationError(f"@idempotent({name}=...) must be > 0, got {out[name]!r}")
    return tuple(sorted(out.items()))


@functools.lru_cache(maxsize=256)
def _apply_cached(base: Options, overrides: Overrides) -> Options:
    applied = replace(base, **dict(overrides))
    _check_max_lease(applied.lease, applied.max_lease, "@idempotent(max_lease=...)")
    return applied


def current(overrides: Overrides) -> Options:
    """The settings in force now (cached per Config) with ``overrides`` applied."""
    base = _options_for(get_config())
    return _apply_cached(base, overrides) if overrides else base
