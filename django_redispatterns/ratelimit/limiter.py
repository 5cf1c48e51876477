"""``RateLimiter``: the programmatic API every adapter (decorator, middleware, DRF) uses.

``RateLimiter("10/m", algorithm="sliding_window").hit("some-key")`` makes exactly one
``EVALSHA`` and returns a :class:`Decision`. :func:`hit_many` / :func:`ahit_many` decide
several rules for one request in one pipelined round trip. Identities are hashed with
:func:`~django_redispatterns.keys.identity_hash` (a keyed hash: a plain hash of an IPv4
address is reversed by enumeration) before they reach a key name, and the digest is the
key's hash tag, so a limiter's keys share one Cluster slot.

Redis being unreachable, timing out, read-only or out of memory raises
:class:`~django_redispatterns.exceptions.BackendUnavailable`; what to do then (fail open or
closed) is the caller's policy.

Decisions run on a client that never re-sends a command (``resend=False``): a fixed-window
or token-bucket call that timed out may have counted, and must not count again; it counts
at most once and the caller sees ``BackendUnavailable``.
"""

from __future__ import annotations

import base64
import functools
import itertools
import os
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from .. import connection, keys
from ..conf import get_config
from ..exceptions import BackendUnavailable
from ..scripts import Call, arun_many, run_many
from .algorithms import Algorithm, Decision, get_algorithm
from .rates import DEFAULT_ALGORITHM, Rate, parse_rate, validate_algorithm

FEATURE = "RATELIMIT"
KEY_FEATURE = "rl"

# Errors meaning "Redis cannot decide right now" (as opposed to a bug in our call).
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
    OSError,
)


def new_request_id() -> str:
    """A unique id per hit: the sliding-window log member.

    A random per-process prefix (re-drawn in a forked child) and a counter: unique across
    processes and threads without a system call per hit.
    """
    return f"{_rid_prefix}{next(_rid_counter):x}"


def _reseed_request_ids() -> None:
    global _rid_prefix, _rid_counter
    _rid_prefix = os.urandom(8).hex() + "-"
    _rid_counter = itertools.count(1)


_rid_prefix = ""
_rid_counter = itertools.count(1)
_reseed_request_ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_request_ids)


class RateLimiter:
    """A rate (``"100/m"``, ``"5/10s"``) enforced with one algorithm over Redis.

    ``group`` namespaces the counters (two limiters with the same group, rate and
    algorithm share counters for the same identity). ``connection`` overrides
    ``REDIS_PATTERNS['RATELIMIT']['CONNECTION']`` (a CACHES alias or a URL).
    """

    def __init__(
        self,
        rate: str | Rate,
        *,
        algorithm: str = DEFAULT_ALGORITHM,
        burst: int | None = None,
        group: str = "default",
        name: str | None = None,
        connection: str | None = None,
    ) -> None:
        self.rate = parse_rate(rate) if isinstance(rate, str) else rate
        self.algorithm: Algorithm = get_algorithm(validate_algorithm(algorithm))(self.rate, burst)
        self.group = group
        self.name = name or "default"
        self.connection = connection
        # Per settings object: identity -> ((state key,), partition key), and the
        # connection name, so that a decision costs one dict lookup before the EVALSHA.
        self._config: Any = None
        self._names: dict[str, tuple[tuple[str], str]] = {}
        self._connection_name = ""

    def __repr__(self) -> str:
        return (f"RateLimiter({str(self.rate)!r}, algorithm={self.algorithm.name!r}, "
                f"group={self.group!r})")

    # --- keys -------------------------------------------------------------------------

    def digest(self, identity: str) -> str:
        """Keyed hash of (group, identity): injective, and no raw identity in key names."""
        _fresh()
        return names(self.group, identity, "", "")[0]

    def key(self, identity: str) -> str:
        """The Redis key holding ``identity``'s state under this limiter."""
        _fresh()
        return names(self.group, identity, self.algorithm.code, self.algorithm.shape)[1]

    def partition_key(self, identity: str) -> str:
        """The ``pk`` of the rate-limit headers for ``identity``: base64 of a keyed hash of
        the (group, identity) digest; it names the client's bucket without revealing the
        identity or the Redis key."""
        _fresh()
        return names(self.group, identity, self.algorithm.code, self.algorithm.shape)[2]

    def call(self, identity: str, cost: int = 1, request_id: str | None = None) -> Call:
        """The script call that decides one hit (for :func:`hit_many` pipelines)."""
        return self.prepare(identity, cost, request_id)[0]

    def prepare(self, identity: str, cost: int = 1,
                request_id: str | None = None) -> tuple[Call, str]:
        """(the script call, the partition key) for one hit."""
        if cost.__class__ is not int or cost < 0:
            raise ValueError(f"cost must be a non-negative integer, got {cost!r}")
        config = get_config()
        if config is not self._config:
            self._settings_changed(config)
        entry = self._names.get(identity)
        if entry is None:
            entry = self._name(identity)
        algo = self.algorithm
        rid = (request_id or new_request_id()) if algo.uses_request_id else ""
        return (algo.lua, entry[0], algo.args(cost, rid)), entry[1]

    def _settings_changed(self, config: Any) -> None:
        self._names = {}
        self._connection_name = (self.connection if self.connection is not None
                                 else config.connection_for(FEATURE))
        self._config = config

    def _name(self, identity: str) -> tuple[tuple[str], str]:
        _fresh()
        _, key, pk = names(self.group, identity, self.algorithm.code, self.algorithm.shape)
        entry = ((key,), pk)
        if len(identity) <= _CACHEABLE_IDENTITY:  # client-chosen long values: not kept
            if len(self._names) >= _NAMES_PER_LIMITER:
                self._names = {}
            self._names[identity] = entry
        return entry

    # --- sync -------------------------------------------------------------------------

    def client(self) -> Any:
        """The client decisions run on: it never re-sends a call."""
        config = get_config()
        if config is not self._config:
            self._settings_changed(config)
        return connection.client_for(self._connection_name, resend=False)

    def hit(self, identity: str, cost: int = 1, *, request_id: str | None = None) -> Decision:
        """Count ``cost`` hits for ``identity`` if they fit; one round trip.

        A rejected hit counts nothing, and a call that timed out counts at most once
        (it raises ``BackendUnavailable``). ``request_id`` only matters to the sliding
        window, where it is the hit's log member: passing the same one again counts nothing
        more. The other algorithms ignore it.
        """
        (lua, key_names, args), pk = self.prepare(identity, cost, request_id)
        try:  # prepare() brought the connection name up to date with the settings
            raw = lua(connection.client_for(self._connection_name, resend=False), key_names,
                      args)
        except UNAVAILABLE_ERRORS as exc:
            raise BackendUnavailable(f"rate limit check failed: {exc}") from exc
        return self.algorithm.decision(raw, self.name, cost, pk)

    def peek(self, identity: str) -> Decision:
        """The current state for ``identity`` without counting anything."""
        return self.hit(identity, 0)

    def reset(self, identity: str) -> bool:
        """Forget ``identity``'s state (unblock it); True if there was any."""
        try:
            return bool(self.client().delete(self.key(identity)))
        except UNAVAILABLE_ERRORS as exc:
            raise BackendUnavailable(f"rate limit reset failed: {exc}") from exc

    # --- async ------------------------------------------------------------------------

    def async_client(self) -> Any:
        """The asyncio client decisions run on: it never re-sends a call."""
        config = get_config()
        if config is not self._config:
            self._settings_changed(config)
        return connection.async_client_for(self._connection_name, resend=False)

    async def ahit(self, identity: str, cost: int = 1, *,
                   request_id: str | None = None) -> Decision:
        """Async twin of :meth:`hit` (``redis.asyncio``; no thread hop)."""
        (lua, key_names, args), pk = self.prepare(identity, cost, request_id)
        try:
            client = connection.async_client_for(self._connection_name, resend=False)
            raw = await lua.acall(client, key_names, args)
        except UNAVAILABLE_ERRORS as exc:
            raise BackendUnavailable(f"rate limit check failed: {exc}") from exc
        return self.algorithm.decision(raw, self.name, cost, pk)

    async def apeek(self, identity: str) -> Decision:
        return await self.ahit(identity, 0)

    async def areset(self, identity: str) -> bool:
        try:
            return bool(await self.async_client().delete(self.key(identity)))
        except UNAVAILABLE_ERRORS as exc:
            raise BackendUnavailable(f"rate limit reset failed: {exc}") from exc


# Key names per (group, identity, algorithm, shape), valid while the settings object lives
# (a new SECRET_KEY or KEY_PREFIX replaces it): the HMAC and key building leave the hot path.
_names_config: Any = None


def _fresh() -> None:
    global _names_config
    config = get_config()
    if config is not _names_config:
        _names.cache_clear()
        _names_config = config


def names(group: str, identity: str, code: str, shape: str) -> tuple[str, str, str]:
    """(digest, state key, partition key) for one identity under one limiter shape.

    Cached, except for long identities (client-chosen header values), which would let a
    client fill process memory through the cache.
    """
    if len(identity) > _CACHEABLE_IDENTITY:
        return _names.__wrapped__(group, identity, code, shape)
    return _names(group, identity, code, shape)


_CACHEABLE_IDENTITY = 128
_NAMES_PER_LIMITER = 4096


@functools.lru_cache(maxsize=16384)
def _names(group: str, identity: str, code: str, shape: str) -> tuple[str, str, str]:
    digest = keys.identity_hash(f"{len(group)}:{group}|{identity}", purpose="ratelimit")
    if not code:
        return digest, "", ""
    partition = bytes.fromhex(keys.identity_hash(digest, purpose="ratelimit-pk")[:24])
    return (digest, keys.make_key(KEY_FEATURE, code, shape, tag=digest),
            base64.b64encode(partition).decode())


Hit = tuple[RateLimiter, str, int, "str | None"]


def _calls(hits: Sequence[Hit]) -> list[tuple[Call, str]]:
    return [limiter.prepare(identity, cost, rid) for limiter, identity, cost, rid in hits]


def _decisions(hits: Sequence[Hit], calls: list[tuple[Call, str]],
               results: list[Any]) -> list[Decision]:
    out = []
    for (limiter, _, cost, _), (_, pk), raw in zip(hits, calls, results, strict=True):
        if isinstance(raw, UNAVAILABLE_ERRORS):
            raise BackendUnavailable(f"rate limit check failed: {raw}") from raw
        if isinstance(raw, Exception):
            raise raw
        out.append(limiter.algorithm.decision(raw, limiter.name, cost, pk))
    return out


def _same_connection(hits: Sequence[Hit]) -> str | None:
    connections = {limiter.connection for limiter, *_ in hits}
    if len(connections) > 1:
        raise ValueError("hit_many() needs limiters on one connection")
    return connections.pop() if connections else None


def hit_many(hits: Sequence[Hit]) -> list[Decision]:
    """Decide several (limiter, identity, cost, request_id) hits in one round trip.

    Each hit is decided on its own (a hit one rule rejects may still count in another).
    """
    if not hits:
        return []
    calls = _calls(hits)
    client = hits[0][0].client()
    _same_connection(hits)
    try:
        results = run_many(client, [call for call, _ in calls])
    except UNAVAILABLE_ERRORS as exc:
        raise BackendUnavailable(f"rate limit check failed: {exc}") from exc
    return _decisions(hits, calls, results)


async def ahit_many(hits: Sequence[Hit]) -> list[Decision]:
    """Async twin of :func:`hit_many`."""
    if not hits:
        return []
    calls = _calls(hits)
    client = hits[0][0].async_client()
    _same_connection(hits)
    try:
        results = await arun_many(client, [call for call, _ in calls])
    except UNAVAILABLE_ERRORS as exc:
        raise BackendUnavailable(f"rate limit check failed: {exc}") from exc
    return _decisions(hits, calls, results)
