"""Which Redis servers the project uses, for what, and probing each once.

Every configured endpoint (CACHES entries, ``REDIS_PATTERNS`` connections, the servers
behind a Sentinel or a Cluster) is collected with the roles that use it, then probed in
parallel with :data:`PROBE_TIMEOUT`; an unreachable server carries its error instead of
facts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.conf import settings

from ..conf import SETTING_NAME, Config
from ..connection import parse_url, redact_text
from ..connection.tls import ssl_options, uses_tls
from .messages import OUR_SESSION_ENGINE
from .project import (
    DJANGO_CACHE_SESSION_ENGINES,
    cache_sentinels,
    cache_url,
    connection_problem,
    load_config,
    position,
    redis_caches,
    url_db,
)
from .rights import Need, needs, probe_rights
from .server import ServerFacts, read_facts

# Seconds a deploy check waits for one server (connect, and each reply).
PROBE_TIMEOUT = 2.0



@dataclass
class Target:
    """One configured endpoint to probe, with everything that uses it."""

    connection: str  # URL
    options: dict[str, Any] = field(default_factory=dict)  # extra client kwargs
    sentinels: list[tuple[str, int]] = field(default_factory=list)
    roles: set[str] = field(default_factory=set)  # "cache:<alias>", "locks", ...
    features: dict[str, str] = field(default_factory=dict)  # app feature -> its connection
    caches: set[str] = field(default_factory=set)  # aliases of the caches on it
    dbs: set[int] = field(default_factory=set)

    @property
    def endpoint(self) -> str:
        parts = urlsplit(self.connection)
        if parts.scheme == "unix":
            return f"unix:{parts.path}"
        hosts = parts.netloc.rsplit("@", 1)[-1]
        if "," in hosts:  # Cluster / Sentinel: several host:port pairs
            return f"{parts.scheme}://{hosts}"
        address = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        return address if parts.scheme == "redis" else f"{parts.scheme}://{address}"


_CLIENT_KWARGS = ("username", "password", "ssl", "client_name", "protocol")


def _cache_client_options(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Connection kwargs (credentials, TLS) a CACHES entry adds to its URL."""
    options = dict(entry.get("OPTIONS") or {})
    picked: dict[str, Any] = {}
    for source in (options, options.get("CONNECTION_POOL_KWARGS") or {}):
        for key, value in source.items():
            lower = key.lower()
            if lower in _CLIENT_KWARGS or lower.startswith("ssl_"):
                picked[lower] = value
    return picked


def _features_in_use(config: Config, everything: bool = False) -> dict[str, str]:
    """Durable-ish features this project evidently uses (``everything``: all of them)
    -> their connection.

    A feature counts as used when its setting section is given, its middleware or engine
    is installed, or its module has been imported by the time checks run (URLconfs and
    views are imported by then).
    """
    if everything:
        return {"sessions": config.connection_for("SESSIONS"),
                "idempotency records": config.connection_for("IDEMPOTENCY"),
                "locks": config.connection_for("LOCKS"),
                "rate limits": config.connection_for("RATELIMIT")}
    raw = getattr(settings, SETTING_NAME, {}) or {}
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    used: dict[str, str] = {}
    if getattr(settings, "SESSION_ENGINE", "") == OUR_SESSION_ENGINE:
        used["sessions"] = config.connection_for("SESSIONS")
    if ("IDEMPOTENCY" in raw or "django_redispatterns.idempotency" in sys.modules
            or position(middleware, "IdempotencyMiddleware", ours=True) is not None):
        used["idempotency records"] = config.connection_for("IDEMPOTENCY")
    if "LOCKS" in raw or "django_redispatterns.locks" in sys.modules:
        used["locks"] = config.connection_for("LOCKS")
    if ("RATELIMIT" in raw or "django_redispatterns.ratelimit" in sys.modules
            or position(middleware, "RateLimitMiddleware", ours=True) is not None):
        used["rate limits"] = config.connection_for("RATELIMIT")
    return used


def collect_targets(everything: bool = False) -> list[Target]:
    """Every configured Redis endpoint, each once, with the roles that use it
    (``everything``: as if every feature were used)."""
    targets: dict[tuple[Any, ...], Target] = {}

    def add(connection: str, role: str, options: Mapping[str, Any] | None = None,
            sentinels: Iterable[tuple[str, int]] = ()) -> Target:
        parts = urlsplit(connection)
        # netloc, not hostname/port: Cluster and Sentinel URLs list several host:port pairs
        key = (parts.scheme, parts.netloc.rsplit("@", 1)[-1].lower(),
               parts.path if parts.scheme == "unix" else "", tuple(sorted(sentinels)))
        target = targets.get(key)
        if target is None:
            target = targets[key] = Target(connection, dict(options or {}), list(sentinels))
        target.roles.add(role)
        # the static check judges a cluster URL's db
        if parts.scheme not in ("redis+cluster", "rediss+cluster"):
            target.dbs.add(url_db(connection))
        return target

    caches = redis_caches()
    session_alias = getattr(settings, "SESSION_CACHE_ALIAS", "default")
    session_engine = getattr(settings, "SESSION_ENGINE", "")
    for alias, entry in caches.items():
        location = cache_url(entry)
        if location is None:
            continue
        options = _cache_client_options(entry)  # location names the database already
        sentinels = cache_sentinels(entry)
        add(location, f"cache {alias!r}", options, sentinels).caches.add(alias)
        if alias == session_alias and session_engine in DJANGO_CACHE_SESSION_ENGINES:
            add(location, "sessions", options, sentinels)

    config, _ = load_config()
    if config is not None:
        for feature, connection in _features_in_use(config, everything).items():
            if connection_problem(connection):
                continue  # E004 already says so
            if "://" in connection:
                add(connection, feature).features[feature] = connection
            else:
                entry = caches[connection]
                url = cache_url(entry)
                if url is not None:  # always: connection_problem checked it
                    add(url, feature, _cache_client_options(entry),
                        cache_sentinels(entry)).features[feature] = connection
    return list(targets.values())


def _probe_client(url: str, options: Mapping[str, Any]) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = {k: v for k, v in options.items() if k != "db"}
    if uses_tls(url):  # the entry's own ssl_* options win
        kwargs = {**ssl_options(), **kwargs}
    return redis.Redis.from_url(
        _without_db(url), socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT,
        retry=Retry(NoBackoff(), 0), single_connection_client=True, **kwargs,
    )


def _endpoints(target: Target) -> list[tuple[str, Any]]:
    """(display name, client factory) of every server behind ``target``."""
    parsed = parse_url(target.connection)
    scheme = parsed.scheme
    tls: dict[str, Any] = {"ssl": True, **ssl_options()} if parsed.tls else {}
    node_scheme = "rediss" if parsed.tls else "redis"
    if scheme == "redis+cluster":
        from redis.cluster import ClusterNode, RedisCluster

        creds = parsed.credentials
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in parsed.hosts],
            socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT, **creds,
            **tls,
        )
        try:
            nodes = [(n.host, n.port) for n in cluster.get_primaries()]
        finally:
            cluster.close()
        return [(f"{h}:{p}", _factory(f"{node_scheme}://{h}:{p}/0",
                                      {**target.options, **creds}))
                for h, p in nodes]
    if scheme == "redis+sentinel" or target.sentinels:
        from redis.sentinel import Sentinel

        if scheme == "redis+sentinel":
            service = parsed.path[0]
            hosts = list(parsed.hosts)
            options = {**target.options, **parsed.credentials}
        else:
            service = urlsplit(target.connection).hostname or ""
            hosts = list(target.sentinels)
            options = dict(target.options)
        timeouts: dict[str, Any] = {"socket_timeout": PROBE_TIMEOUT,
                                    "socket_connect_timeout": PROBE_TIMEOUT}
        sentinel_password = parsed.query.get("sentinel_password")
        sentinel = Sentinel(hosts, sentinel_kwargs={
            **timeouts, **tls,
            **({"password": sentinel_password} if sentinel_password else {})}, **timeouts)
        host, port = sentinel.discover_master(service)
        for client in sentinel.sentinels:
            client.close()
        return [(f"{host}:{port} (master of {service!r})",
                 _factory(f"{node_scheme}://{host}:{port}/0", options))]
    return [(target.endpoint, _factory(target.connection, target.options))]


def _without_db(url: str) -> str:
    """``url`` on database 0: settings are per instance, and a Cluster refuses SELECT."""
    parts = urlsplit(url)
    query = urlencode([(k, v) for k, values in parse_qs(parts.query).items() if k != "db"
                       for v in values])
    path = parts.path if parts.scheme == "unix" else "/0"
    # Built by hand: urlunsplit drops the "//" of "unix:///path", which redis-py needs.
    return f"{parts.scheme}://{parts.netloc}{path}" + (f"?{query}" if query else "")


def _factory(url: str, options: Mapping[str, Any]) -> Any:
    return lambda: _probe_client(url, options)


def probe(target: Target) -> list[ServerFacts]:
    """Facts about every server behind ``target``; an unreachable one carries ``error``."""
    import redis

    try:
        endpoints = _endpoints(target)
    except (redis.RedisError, OSError, IndexError, ValueError) as exc:
        return [ServerFacts(target.endpoint, error=_describe(exc))]
    results = []
    wanted = rights_needed(target)
    for name, make_client in endpoints:
        try:
            client = make_client()
            try:
                facts = read_facts(client, name)
                _read_rights(client, facts, wanted)
                results.append(facts)
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError) as exc:
            results.append(ServerFacts(name, error=_describe(exc)))
    return results


def rights_needed(target: Target, near: bool = False, extras: bool = False) -> list[Need]:
    """What the features using ``target`` need of its user (``checks.rights``; ``near``:
    as if every cache had a near cache; ``extras``: with django-redis's data-type API)."""
    config, _ = load_config()
    if config is None:
        return []
    caches = {alias: entry for alias, entry in redis_caches().items() if alias in target.caches}
    return needs(config, target.features, caches, select=any(target.dbs), near=near,
                 extras=extras)


def _read_rights(client: Any, facts: ServerFacts, wanted: list[Need]) -> None:
    import redis

    if not wanted:
        return
    facts.missing = []
    try:
        for need in wanted:
            found = probe_rights(client, need)
            if found is None:
                facts.missing, facts.rights_unknown = None, "the server does not queue MULTI"
                return
            facts.missing += [(m.feature, m.command) for m in found]
    except (redis.RedisError, OSError) as exc:
        facts.missing, facts.rights_unknown = None, _describe(exc)


def _merge_rights(into: ServerFacts, other: ServerFacts) -> None:
    into.rights_unknown = into.rights_unknown or other.rights_unknown
    if other.missing is not None:
        known = into.missing or []
        into.missing = known + [m for m in other.missing if m not in known]


def _describe(exc: BaseException) -> str:
    return redact_text(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))


@dataclass
class ServerReport:
    facts: ServerFacts
    roles: set[str] = field(default_factory=set)
    dbs: set[int] = field(default_factory=set)

    @property
    def used_by(self) -> str:
        return ", ".join(sorted(self.roles))


def gather() -> list[ServerReport]:
    """Probe every distinct server in parallel, merging endpoints that are one instance."""
    targets = collect_targets()
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        probed = list(pool.map(probe, targets))
    reports: dict[str, ServerReport] = {}
    for target, facts_list in zip(targets, probed, strict=True):
        for facts in facts_list:
            # Two URLs naming one instance (localhost vs 127.0.0.1) share a run_id.
            key = facts.run_id or f"endpoint:{facts.endpoint}"
            report = reports.setdefault(key, ServerReport(facts))
            if report.facts is not facts:  # rights are probed per target: keep them all
                _merge_rights(report.facts, facts)
            report.roles |= target.roles
            report.dbs |= target.dbs
    return list(reports.values())


