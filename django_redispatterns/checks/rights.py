"""Least privilege: the ACL rights each enabled feature needs, and a harmless probe of them.

:func:`needs` lists, per feature in use, the commands it sends (Lua scripts' own calls
included: Redis checks a script's calls against the caller's rights too) and the key
patterns it writes under, derived from the configured prefixes. :func:`acl_setuser` turns
that into one ``ACL SETUSER`` line; :func:`probe_rights` checks a connected user against it
without running anything: each command is queued inside ``MULTI`` with a key under the
feature's prefix and the transaction is discarded, so a missing right shows as ``NOPERM``
at queue time and nothing is executed (Redis and Valkey both refuse at queue time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..conf import Config
from ..keys import glob_escape

# Every feature calls its Lua scripts by SHA and re-sends one as EVAL after NOSCRIPT.
SCRIPTS = ("EVALSHA", "EVAL")
LOCKS = (*SCRIPTS, "BLPOP", "DEL", "EXISTS", "GET", "LPUSH", "LTRIM", "MGET", "PEXPIRE", "PTTL",
         "SCAN", "SET", "TIME", "WAIT", "MULTI", "EXEC")
RATELIMIT = (*SCRIPTS, "DECRBY", "DEL", "GET", "INCR", "INCRBY", "PEXPIRE", "PTTL", "SET", "TIME",
             "ZADD", "ZCARD", "ZRANGE", "ZREMRANGEBYSCORE", "ZSCORE")
IDEMPOTENCY = (*SCRIPTS, "DEL", "GET", "PEXPIRE", "PTTL", "SCAN", "SET", "WAIT")
SESSIONS = (*SCRIPTS, "COPY", "DEL", "EXISTS", "HDEL", "HEXISTS", "HGET", "HMGET", "HSET",
            "PEXPIRE", "PEXPIREAT", "PTTL", "SET", "TIME", "TYPE", "ZADD", "ZCARD", "ZRANGE",
            "ZREM", "ZREMRANGEBYSCORE", "ZREVRANGE", "ZSCORE", "MULTI", "EXEC")
# A Redis cache: Django's cache API through django-redis and this app's backend (stampede
# claims, counters, clear() and keys() by SCAN, the typed writes that keep a TTL), and
# PING (connection health checks, get_redis_connection(alias).ping()).
CACHE = (*SCRIPTS, "APPEND", "BLMOVE", "DEL", "EXISTS", "EXPIRE", "GET", "HSET", "INCRBY", "LPUSH",
         "MGET", "PERSIST", "PEXPIRE", "PING", "PTTL", "SADD", "SCAN", "SET", "TIME", "TOUCH",
         "TTL", "UNLINK", "ZADD", "MULTI", "EXEC", "WATCH", "UNWATCH")
# django-redis's data-type API beyond Django's cache API (sets, hashes, sorted sets; the
# backend keeps a TTL on what they write): granted only when asked for.
CACHE_EXTRAS = ("HDEL", "HEXISTS", "HKEYS", "HLEN", "SCARD", "SDIFF", "SDIFFSTORE", "SINTER",
                "SINTERSTORE", "SISMEMBER", "SMEMBERS", "SMISMEMBER", "SMOVE", "SPOP",
                "SRANDMEMBER", "SREM", "SSCAN", "SUNION", "SUNIONSTORE", "ZCARD", "ZCOUNT",
                "ZINCRBY", "ZPOPMAX", "ZPOPMIN", "ZRANGE", "ZRANGEBYSCORE", "ZRANK", "ZREM",
                "ZREMRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZSCORE")
# The near cache's tracking: the read connections redirect invalidations to a listening
# connection subscribed to Redis's invalidation channel (kept alive by PING).
NEAR_CACHE = ("CLIENT|TRACKING", "CLIENT|ID", "SUBSCRIBE", "PING")
NEAR_CHANNEL = "__redis__:invalidate"
# Following a Sentinel failover asks the promoted replica for its ROLE.
SENTINEL = ("ROLE",)


@dataclass
class Need:
    """What one feature needs on its connection."""

    feature: str  # "locks", "cache 'default'", ...
    connection: str  # the CACHES alias or URL it uses
    commands: tuple[str, ...]
    patterns: tuple[str, ...]  # key globs, as ACL ~patterns want them
    channels: tuple[str, ...] = ()
    probe_key: str = ""  # a key no one uses, under the feature's prefix


def _prefixed(prefix: str, *parts: str) -> str:
    return ":".join((prefix, *parts))


def needs(config: Config, features: Mapping[str, str], caches: Mapping[str, Mapping[str, Any]],
          select: bool = False, near: bool = False, extras: bool = False) -> list[Need]:
    """The rights of every feature in ``features`` (name -> connection) and every cache in
    ``caches`` (alias -> CACHES entry); ``select``: some of them use a database other
    than 0, so the connections send SELECT; ``near``: as if every cache had a near cache
    (and the sessions theirs, ``SESSIONS["NEAR_CACHE"]``);
    ``extras``: the caches' users call django-redis's data-type API too."""
    prefix = config.key_prefix
    extra = ("SELECT",) if select else ()
    listed: list[Need] = []
    for alias, entry in caches.items():
        cache_prefix = str(entry.get("KEY_PREFIX", ""))
        options = entry.get("OPTIONS") or {}
        tracked = near or (isinstance(options, Mapping) and bool(options.get("NEAR_CACHE")))
        commands = (CACHE + extra + (NEAR_CACHE if tracked else ())
                    + (CACHE_EXTRAS if extras else ()))
        if "sentinel" in str(options.get("CLIENT_CLASS", "")).lower():
            commands += SENTINEL
        listed.append(Need(f"cache {alias!r}", alias, commands,
                           (glob_escape(cache_prefix) + ":*",),
                           (NEAR_CHANNEL,) if tracked else (),
                           _prefixed(cache_prefix, "rp-acl-probe")))
    table = {"locks": (LOCKS, "lock"), "rate limits": (RATELIMIT, "rl"),
             "idempotency records": (IDEMPOTENCY, "idem"), "sessions": (SESSIONS, "sess")}
    for feature, connection in features.items():
        commands, part = table[feature]
        commands += extra
        if connection.startswith("redis+sentinel://"):
            commands += SENTINEL
        tracked = feature == "sessions" and (
            near or bool(config.feature("SESSIONS")["NEAR_CACHE"]))
        if tracked:  # loads from process memory: the same tracking as a near cache
            commands += NEAR_CACHE
        listed.append(Need(feature, connection, commands,
                           (f"{glob_escape(prefix)}:{part}:*",),
                           (NEAR_CHANNEL,) if tracked else (),
                           _prefixed(prefix, part, "acl-probe")))
    return listed


def acl_setuser(user: str, listed: Iterable[Need], password: str = "<password>") -> str:
    """One ``ACL SETUSER`` line granting exactly what ``listed`` needs (and nothing else:
    ``reset`` first). The password is a placeholder for the operator to fill in."""
    listed = list(listed)
    commands = sorted({c for need in listed for c in need.commands})
    patterns = sorted({p for need in listed for p in need.patterns})
    channels = sorted({c for need in listed for c in need.channels})
    words = ["ACL", "SETUSER", user, "reset", "on", f">{password}"]
    words += [f"~{p}" for p in patterns]
    words += ["resetchannels"] + [f"&{c}" for c in channels]
    words += ["-@all"] + [f"+{c.lower()}" for c in commands]
    return " ".join(words)


@dataclass
class Missing:
    feature: str
    command: str


def _probe_args(command: str, key: str) -> list[Any]:
    """A well-formed call of ``command`` on ``key``, queued only, never run (the arity
    must be right: Redis checks it before the rights)."""
    name = command.replace("|", " ").split()
    args = _ARGS.get(command, [key])
    return [*name, *(key if a is _KEY else a for a in args)]


_KEY = object()
_ARGS: dict[str, list[Any]] = {
    "EVALSHA": ["0" * 40, 1, _KEY], "EVAL": ["return 0", 1, _KEY], "BLPOP": [_KEY, 1],
    "WAIT": [0, 0], "TIME": [], "PING": [], "ROLE": [], "CLIENT|ID": [],
    "SCAN": [0, "COUNT", 1], "COPY": [_KEY, _KEY], "BLMOVE": [_KEY, _KEY, "RIGHT", "LEFT", 1],
    "SUBSCRIBE": [NEAR_CHANNEL], "CLIENT|TRACKING": ["off"], "SELECT": [0],
    "APPEND": [_KEY, "x"], "DECRBY": [_KEY, 1], "INCRBY": [_KEY, 1], "EXPIRE": [_KEY, 1],
    "PEXPIRE": [_KEY, 1], "PEXPIREAT": [_KEY, 1], "HEXISTS": [_KEY, "f"], "HGET": [_KEY, "f"],
    "HMGET": [_KEY, "f"], "HSET": [_KEY, "f", "v"], "LPUSH": [_KEY, "v"], "LTRIM": [_KEY, 0, 0],
    "SADD": [_KEY, "m"], "SET": [_KEY, "v"], "ZADD": [_KEY, 0, "m"], "ZRANGE": [_KEY, 0, 0],
    "ZREM": [_KEY, "m"], "ZREMRANGEBYSCORE": [_KEY, 0, 0], "ZSCORE": [_KEY, "m"],
}


def probe_rights(client: Any, need: Need) -> list[Missing] | None:
    """The commands of ``need`` the connected user may not run; ``None`` when that cannot
    be told (the server answers ``MULTI`` with something else than OK or NOPERM).

    Each command is queued, with a key under the feature's prefix, in a transaction that
    is then discarded: nothing runs, but a command, key or channel the user lacks is refused
    (``NOPERM``) as it is queued. WATCH cannot be queued; it is sent outside the
    transaction on the probe key and undone by UNWATCH, and EXEC is sent after the
    transaction is discarded, where it only answers "EXEC without MULTI" (or NOPERM).
    """
    from redis.exceptions import NoPermissionError, ResponseError

    conn = client.connection_pool.make_connection()
    missing: list[Missing] = []

    def send(*args: Any) -> BaseException | None:
        conn.send_command(*args)
        try:
            conn.read_response()
        except ResponseError as exc:
            return exc
        return None

    def refused(command: str, *args: Any) -> bool:
        error = send(*args)
        if isinstance(error, NoPermissionError):
            missing.append(Missing(need.feature, command.replace("|", " ")))
            return True
        return False

    try:
        conn.connect()
        for command in ("WATCH", "UNWATCH"):
            if command in need.commands:
                refused(command, command, *([need.probe_key] if command == "WATCH" else []))
        send("UNWATCH")
        error = send("MULTI")
        if isinstance(error, NoPermissionError):
            return [*missing, Missing(need.feature, "MULTI")]
        if error is not None:
            return None
        try:
            for command in need.commands:
                if command not in ("MULTI", "EXEC", "WATCH", "UNWATCH"):
                    # other errors (a wrong argument) say nothing about rights
                    refused(command, *_probe_args(command, need.probe_key))
        finally:
            send("DISCARD")
        if "EXEC" in need.commands:  # outside a transaction EXEC only says so (or NOPERM)
            refused("EXEC", "EXEC")
    finally:
        conn.disconnect()
    return missing
