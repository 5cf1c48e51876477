"""The cache's own ``OPTIONS`` (besides django-redis's), validated once per backend.

A wrong type or range raises :class:`ConfigurationError` naming the option. Defaults and
meanings are in docs/cache.md, "Options".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError

# The options this backend reads besides django-redis's (the checks refuse any other).
OWN_OPTIONS = frozenset({"ALLOW_NO_TTL", "TTL_JITTER", "CLEAR_FLUSHDB", "STAMPEDE_LEASE",
                         "STAMPEDE_WAIT", "STALE_TTL", "XFETCH_BETA", "NEAR_CACHE",
                         "LOCK_KEYS", "GET_OR_SET_FORMAT"})
# OPTIONS["LOCK_KEYS"]: where ``cache.lock(name)`` keeps its lease. "django-redis" (the
# default): django-redis's own key for ``name`` on the cache's server, so a django-redis
# process's ``cache.lock(name)`` and ours exclude each other; "patterns": the locks' keys
# on the locks' connection (the 0.1.0 layout, to keep during an upgrade from 0.1.0).
LOCK_KEYS = ("django-redis", "patterns")
# OPTIONS["GET_OR_SET_FORMAT"]: how ``get_or_set`` stores its value. "plain" (the default
# and the only format written): exactly django-redis's bytes under the key, so every
# process of a mixed fleet reads the value; early recomputation's and STALE_TTL's metadata
# lives in a companion key. The option is kept so settings written for the deploy window
# stay valid.
FORMATS = ("plain",)


@dataclass(frozen=True)
class Policy:
    """Stampede settings of one cache."""

    lease: float  # the longest a computing caller holds its claim (STAMPEDE_LEASE)
    max_wait: float  # seconds a waiter waits in all before computing on its own
    stale_ttl: float  # seconds a value is kept (and served) after it expires
    beta: float  # XFetch β; 0 turns early recomputation off
    block_cap: float  # longest single blocking wait (below the socket timeout)
    claim_lease: float  # a claim's lease, extended every third of it while computing

    @property
    def renew_every(self) -> float:
        return self.claim_lease / 3


@dataclass(frozen=True)
class CacheOptions:
    allow_no_ttl: bool
    jitter: float
    clear_flushdb: bool
    policy: Policy
    lock_keys: str = LOCK_KEYS[0]


def read(options: dict[str, Any]) -> CacheOptions:
    number = (int, float)
    lease = _option(options, "STAMPEDE_LEASE", 10, number, minimum=0.01)
    _choice(options, "GET_OR_SET_FORMAT", FORMATS)  # validated; one format
    stale_ttl = float(_option(options, "STALE_TTL", 0, number, minimum=0))
    return CacheOptions(
        allow_no_ttl=_option(options, "ALLOW_NO_TTL", False, (bool,)),
        jitter=_option(options, "TTL_JITTER", 0.0, number, minimum=0, maximum=0.9),
        clear_flushdb=_option(options, "CLEAR_FLUSHDB", False, (bool,)),
        lock_keys=_choice(options, "LOCK_KEYS", LOCK_KEYS),
        policy=Policy(
            lease=float(lease),
            max_wait=float(_option(options, "STAMPEDE_WAIT", 2 * lease, number, minimum=0)),
            stale_ttl=stale_ttl,
            beta=float(_option(options, "XFETCH_BETA", 1.0, number, minimum=0)),
            block_cap=block_cap(options.get("SOCKET_TIMEOUT")),
            claim_lease=claim_lease(options.get("SOCKET_TIMEOUT"), float(lease)),
        ),
    )


def _choice(options: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    """``options[name]``, one of ``choices`` (default: the first)."""
    value = options.get(name, choices[0])
    if value not in choices:
        raise ConfigurationError(f"CACHES OPTIONS[{name!r}] must be one of "
                                 f"{', '.join(map(repr, choices))}, got {value!r}.")
    return str(value)


def block_cap(socket_timeout: float | None) -> float:
    """Longest single BLMOVE: it must end before the client's socket timeout fires."""
    if not socket_timeout or math.isinf(socket_timeout):
        return 5.0
    return max(0.05, float(socket_timeout) - 0.25)


def claim_lease(socket_timeout: float | None, lease: float) -> float:
    """A fresh claim's lease: 3 socket timeouts (3 s without one), at least 1 s, at most
    STAMPEDE_LEASE. It bounds how long a claim nobody works on (its caller timed out,
    crashed, or the server restarted with it) blocks other callers; the computing caller
    extends it every third of it, so a renewal that times out once is not yet fatal."""
    timeouts = 3.0 if not socket_timeout or math.isinf(socket_timeout) else 3 * socket_timeout
    return min(lease, max(1.0, float(timeouts)))


def _option(options: dict[str, Any], name: str, default: Any, kind: tuple[type, ...],
            *, minimum: Any = None, maximum: Any = None) -> Any:
    value = options.get(name, default)
    if value is None and default is None:
        return None
    if (isinstance(value, bool) and bool not in kind) or not isinstance(value, kind):
        raise ConfigurationError(
            f"CACHES OPTIONS[{name!r}] must be {' or '.join(k.__name__ for k in kind)}, "
            f"got {value!r}."
        )
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigurationError(
            f"CACHES OPTIONS[{name!r}] must be between {minimum} and {maximum}, got {value!r}."
        )
    return value
