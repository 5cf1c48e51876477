"""System checks: what in the settings, or in the Redis server, will hurt in production.

Static checks run with every ``manage.py`` command and never touch the network. Deploy
checks (``manage.py check --deploy``) contact each distinct Redis server once, in
parallel, with a short timeout; an unreachable server is a warning, never a crash or a
hang. Settings are read with ``CONFIG GET`` and, where that is disabled (managed Redis,
ACLs, a renamed command), from ``INFO``; a value the server hides is reported as
unknown (an ``Info``), never as a problem.

Every message is defined once below (:data:`MESSAGES`) with its id, text and hint, and
documented in ``docs/checks.md``. Silence one with ``SILENCED_SYSTEM_CHECKS``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import SETTING_NAME, Config, build_config
from .exceptions import ConfigurationError

TAG = "redispatterns"

# Seconds a deploy check waits for one server (connect, and each reply).
PROBE_TIMEOUT = 2.0
# The oldest Redis the app supports and is tested on (SPEC).
MIN_VERSION = (6, 2, 0)
# A noeviction instance this full starts refusing writes soon.
HEADROOM_RATIO = 0.9

OUR_SESSION_ENGINE = "django_redispatterns.sessions"
DJANGO_CACHE_SESSION_ENGINES = (
    "django.contrib.sessions.backends.cache",
    "django.contrib.sessions.backends.cached_db",
)
# Backends whose client can be shared through django_redis.get_redis_connection ...
DJANGO_REDIS_BACKENDS = ("django_redispatterns.cache.RedisCache", "django_redis.cache.RedisCache")
# ... and every Redis cache backend (Django's own keeps its client to itself).
REDIS_CACHE_BACKENDS = (*DJANGO_REDIS_BACKENDS, "django.core.cache.backends.redis.RedisCache")
# Features whose data must never be evicted (their keys all have TTLs, so volatile-*
# policies evict them too). Rate-limit counters are not listed: losing one resets a
# window early, which is the cache-like failure a limiter can live with.
DURABLE_FEATURES = ("locks", "sessions", "idempotency records")


@dataclass(frozen=True)
class Message:
    """One check message: level, id, text and hint kept together."""

    level: Callable[..., CheckMessage]
    id: str
    msg: str
    hint: str

    def __call__(self, obj: Any = None, **fields: Any) -> CheckMessage:
        return self.level(
            self.msg.format(**fields), hint=self.hint.format(**fields), obj=obj,
            id=f"{TAG}.{self.id}",
        )


E001 = Message(
    Error, "E001",
    "CACHES[{alias!r}] is Redis-backed and has TIMEOUT None: its keys never expire.",
    "Set a TIMEOUT in seconds (Django's default is 300). If some keys really must live "
    "forever, set OPTIONS['ALLOW_NO_TTL'] = True on django_redispatterns.cache.RedisCache "
    "and keep them on a Redis with maxmemory-policy noeviction.",
)
W001 = Message(
    Warning, "W001",
    "CACHES[{alias!r}] allows keys without a TTL (TIMEOUT None with ALLOW_NO_TTL).",
    "Keys without a TTL are never freed by expiry and are skipped by volatile-* eviction, "
    "so this Redis fills up. Prefer a TIMEOUT; run `manage.py redis_audit` to find such keys.",
)
E002 = Message(Error, "E002", "{error}", "Fix the {setting} setting; see docs/configuration.md.")
E003 = Message(
    Error, "E003", "Invalid rate-limit rule: {error}",
    "Each rule is a dict such as {{'path': r'^/api/', 'rate': '100/m', 'key': 'ip'}}; "
    "rates look like '100/s', '5/m', '1000/h', '10000/d' or '5/10s'.",
)
E004 = Message(
    Error, "E004", "The {feature} connection {connection!r} cannot be used: {error}",
    "Set CONNECTION to the alias of a django-redis CACHES entry (BACKEND "
    "django_redis.cache.RedisCache or django_redispatterns.cache.RedisCache) or to a "
    "redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL.",
)
W002 = Message(
    Warning, "W002",
    "SESSION_ENGINE is {engine!r} but SESSION_SERIALIZER {serializer!r} uses pickle.",
    "Anyone who can write to this Redis can then run code in your app when a session is "
    "loaded. Use django.contrib.sessions.serializers.JSONSerializer (the default).",
)
W004 = Message(
    Warning, "W004",
    "IdempotencyMiddleware comes before {blocker} in MIDDLEWARE.",
    "IdempotencyMiddleware claims the key in process_view, and process_view hooks run in "
    "MIDDLEWARE order. A refusal from a later one (CSRF's 403) happens after the claim, so "
    "it is stored and replayed for the key's TTL. Put IdempotencyMiddleware last.",
)
E008 = Message(
    Error, "E008",
    "RateLimitMiddleware rule(s) keyed on the user ({rules}) run {where}.",
    "A 'user' or 'user_or_ip' key needs request.user. Put "
    "django_redispatterns.middleware.RateLimitMiddleware after "
    "django.contrib.auth.middleware.AuthenticationMiddleware.",
)
E009 = Message(
    Error, "E009",
    "SessionActivityMiddleware is installed but SessionMiddleware is not.",
    "Without request.session it records nothing and cannot answer 503 when Redis is down. "
    "Add django.contrib.sessions.middleware.SessionMiddleware, directly below "
    "django_redispatterns.middleware.SessionActivityMiddleware (recommended; below it "
    "works too).",
)
W003 = Message(
    Warning, "W003",
    "SessionActivityMiddleware is installed but SESSION_ENGINE is {engine!r}.",
    f"Session activity is stored next to sessions of the {OUR_SESSION_ENGINE!r} engine "
    "only; set SESSION_ENGINE to it, or remove the middleware.",
)
# --- deploy checks (contact Redis) ----------------------------------------------------
W010 = Message(
    Warning, "W010", "Could not reach Redis at {server} ({used_by}): {error}",
    "The deploy checks for this server were skipped. Check the URL, credentials and "
    "network; they run with a {timeout:g} s timeout.",
)
W011 = Message(
    Warning, "W011", "Redis at {server} ({used_by}) has no memory limit (maxmemory 0).",
    "Without maxmemory Redis grows until the operating system kills it, losing everything. "
    "Set maxmemory (CONFIG SET maxmemory 1gb, and in redis.conf).",
)
W012 = Message(
    Warning, "W012",
    "Redis at {server} is used as a cache ({used_by}) with maxmemory-policy noeviction.",
    "When it is full every cache write fails with OOM instead of evicting old entries. "
    "Use allkeys-lru or allkeys-lfu on an instance that only holds a cache.",
)
W013 = Message(
    Warning, "W013",
    "Redis at {server} holds {features} but its maxmemory-policy {policy!r} may evict them.",
    "Eviction is per instance, not per database, and volatile-* policies evict these keys "
    "too because they all have TTLs. Use maxmemory-policy noeviction, or move the cache to "
    "its own instance and give this one noeviction.",
)
W014 = Message(
    Warning, "W014",
    "Redis at {server} ({used_by}) uses {percent}% of maxmemory with policy noeviction.",
    "Writes fail with OOM once it is full. Raise maxmemory, lower cache TIMEOUTs, or move "
    "the cache to its own instance.",
)
W015 = Message(
    Warning, "W015", "Redis at {server} ({used_by}) is a read-only replica.",
    "Every write fails there. Point the connection at the master (or use a Sentinel URL).",
)
E010 = Message(
    Error, "E010", "{what} uses database {db} on a Redis Cluster.",
    "Redis Cluster only has database 0; remove the database number from the URL or OPTIONS.",
)
E011 = Message(
    Error, "E011",
    "Redis at {server} ({used_by}) is version {version}; django-redispatterns needs >= "
    f"{'.'.join(map(str, MIN_VERSION))}.",
    "Upgrade Redis (or use Valkey); 6.2 is the oldest version the app supports and is "
    "tested on.",
)
I001 = Message(
    Info, "I001", "Redis at {server} ({used_by}) hides {names}; not checked.",
    "CONFIG GET is unavailable and INFO does not report it (common on managed Redis). "
    "Make sure the provider's setting suits: noeviction where locks, sessions or "
    "idempotency records live, allkeys-lru for a pure cache.",
)

MESSAGES: tuple[Message, ...] = (
    E001, W001, E002, E003, E004, W002, W004, E008, E009, W003,
    W010, W011, W012, W013, W014, W015, E010, E011, I001,
)


# --- static checks ----------------------------------------------------------------------


def _load_config() -> tuple[Config | None, list[CheckMessage]]:
    try:
        return build_config(getattr(settings, SETTING_NAME, {})), []
    except ConfigurationError as exc:
        return None, [E002(error=str(exc), setting=SETTING_NAME)]


def _is_redis_backend(backend: str) -> bool:
    """True for Redis cache backends: django-redis, Django's own, ours, or a subclass."""
    return backend in REDIS_CACHE_BACKENDS or _subclass_of(
        backend, "django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


def _is_django_redis(backend: str) -> bool:
    """True for backends whose client ``django_redis.get_redis_connection`` can share."""
    return backend in DJANGO_REDIS_BACKENDS or _subclass_of(
        backend, "django_redis.cache.RedisCache")


def _subclass_of(path: str, *bases: str) -> bool:
    cls = _resolve(path)  # unimportable: Django's own checks report it
    return cls is not None and issubclass(cls, tuple(import_string(b) for b in bases))


def _redis_caches() -> dict[str, Mapping[str, Any]]:
    caches = getattr(settings, "CACHES", {}) or {}
    return {
        alias: entry for alias, entry in caches.items()
        if isinstance(entry, Mapping) and _is_redis_backend(str(entry.get("BACKEND", "")))
    }


@register(TAG, Tags.caches)
def check_cache_ttls(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E001/W001: a Redis-backed cache whose entries never expire."""
    messages: list[CheckMessage] = []
    for alias, entry in _redis_caches().items():
        if "TIMEOUT" in entry and entry["TIMEOUT"] is None:
            options = entry.get("OPTIONS") or {}
            allowed = options.get("ALLOW_NO_TTL") is True
            messages.append((W001 if allowed else E001)(obj=f"CACHES[{alias!r}]", alias=alias))
    return messages


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E002 (malformed REDIS_PATTERNS), E003 (bad rate-limit rules), E004, E010 (connections)."""
    config, messages = _load_config()
    if config is None:
        return messages
    messages += _check_rules(config)
    messages += _check_connections(config)
    return messages


def _check_rules(config: Config) -> list[CheckMessage]:
    rules = config.feature("RATELIMIT")["RULES"]
    if not rules:
        return []
    try:
        from .ratelimit.rates import validate_rules
    except ImportError:  # the rate-limit feature is not installed in this build
        return []
    try:
        validate_rules(rules)
    except (ConfigurationError, TypeError, ValueError) as exc:
        return [E003(obj=SETTING_NAME, error=exc)]
    return []


def _features_and_connections(config: Config) -> dict[str, str]:
    names = {"top-level": None, "LOCKS": "LOCKS", "RATELIMIT": "RATELIMIT",
             "IDEMPOTENCY": "IDEMPOTENCY", "SESSIONS": "SESSIONS"}
    return {label: config.connection_for(feature) for label, feature in names.items()}


def _connection_problem(connection: str) -> str | None:
    """Why ``connection`` (a CACHES alias or URL) cannot work, or None."""
    if "://" in connection:
        scheme = urlsplit(connection).scheme
        if scheme not in ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster"):
            return f"unsupported URL scheme {scheme!r}"
        return None
    caches = getattr(settings, "CACHES", {}) or {}
    if connection not in caches:
        return f"no such alias in CACHES (aliases: {', '.join(sorted(caches)) or 'none'})"
    entry = caches[connection]
    backend = str(entry.get("BACKEND", ""))
    if not _is_django_redis(backend):
        return (f"CACHES[{connection!r}] uses {backend!r}; only django-redis based backends "
                "share their client")
    if _cache_url(entry) is None:
        return f"CACHES[{connection!r}] has no Redis URL in LOCATION"
    return None


def _cache_url(entry: Mapping[str, Any]) -> str | None:
    """The Redis URL of a CACHES entry (the first of a LOCATION list), or None."""
    location = entry.get("LOCATION")
    if isinstance(location, (list, tuple)):
        location = location[0] if location else None
    if not isinstance(location, str) or "://" not in location:
        return None
    return location


def _cache_sentinels(entry: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(s) for s in (entry.get("OPTIONS") or {}).get("SENTINELS") or []]


def _check_connections(config: Config) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    seen: set[str] = set()
    for label, connection in _features_and_connections(config).items():
        if connection in seen:
            continue
        seen.add(connection)
        problem = _connection_problem(connection)
        if problem:
            messages.append(E004(obj=SETTING_NAME, feature=label, connection=connection,
                                 error=problem))
            continue
        if connection.startswith("redis+cluster://"):
            db = _url_db(connection)
            if db:
                messages.append(E010(obj=SETTING_NAME, what=f"The connection {connection!r}",
                                     db=db))
    return messages


@register(TAG, Tags.security)
def check_session_serializer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W002: our session engine with a serializer that unpickles."""
    engine = getattr(settings, "SESSION_ENGINE", "")
    if engine != OUR_SESSION_ENGINE:
        return []
    serializer = getattr(settings, "SESSION_SERIALIZER",
                         "django.contrib.sessions.serializers.JSONSerializer")
    if _pickles(serializer):
        return [W002(obj="SESSION_SERIALIZER", engine=engine, serializer=serializer)]
    return []


def _pickles(serializer: str) -> bool:
    if "pickle" in serializer.lower():
        return True
    try:
        data = import_string(serializer)().dumps({"probe": 1})
    except Exception:  # an unimportable serializer fails loudly on first use anyway
        return False
    # Pickle protocols >= 2 start with the PROTO opcode.
    return isinstance(data, (bytes, bytearray)) and data[:1] == b"\x80"


# --- middleware ordering ----------------------------------------------------------------

_AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
_SESSION = "django.contrib.sessions.middleware.SessionMiddleware"
_CSRF = "django.middleware.csrf.CsrfViewMiddleware"


def _ours(name: str) -> tuple[str, str]:
    module = {"RateLimitMiddleware": "ratelimit", "IdempotencyMiddleware": "idempotency",
              "SessionActivityMiddleware": "sessions"}[name]
    return (f"django_redispatterns.middleware.{name}",
            f"django_redispatterns.middleware.{module}.{name}")


def _resolve(path: str) -> type | None:
    try:
        cls = import_string(path)
    except Exception:  # Django reports broken entries itself when it loads them
        return None
    return cls if isinstance(cls, type) else None


def _position(middleware: Sequence[str], target: str, *, ours: bool) -> int | None:
    """Index of the first entry that is ``target`` or a subclass of it."""
    paths = _ours(target) if ours else (target,)
    name = target.rsplit(".", 1)[-1]
    for index, path in enumerate(middleware):
        if path in paths:
            return index
        cls = _resolve(path)
        if cls is None:
            continue
        for base in cls.__mro__:
            qualified = f"{base.__module__}.{base.__qualname__}"
            if qualified in paths or (ours and base.__qualname__ == name
                                      and base.__module__.startswith("django_redispatterns.")):
                return index
    return None


def _user_keyed_rules(config: Config | None) -> list[str]:
    if config is None:
        return []
    found = []
    for index, rule in enumerate(config.feature("RATELIMIT")["RULES"]):
        if isinstance(rule, Mapping) and rule.get("key") in ("user", "user_or_ip"):
            found.append(f"#{index} {rule.get('path', '')!r}")
    return found


@register(TAG, Tags.security)
def check_middleware_order(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W004, E008, E009, W003: our middleware placed where it cannot do its job."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    auth = _position(middleware, _AUTH, ours=False)
    session = _position(middleware, _SESSION, ours=False)
    messages: list[CheckMessage] = []

    # Idempotency decides in process_view, after every middleware's request phase, so
    # request.user and request.session exist wherever it sits; what its position decides
    # is whose process_view refusals come after its claim.
    idem = _position(middleware, "IdempotencyMiddleware", ours=True)
    csrf = _position(middleware, _CSRF, ours=False)
    if idem is not None and csrf is not None and idem < csrf:
        messages.append(W004(obj="MIDDLEWARE", blocker="CsrfViewMiddleware"))

    limiter = _position(middleware, "RateLimitMiddleware", ours=True)
    if limiter is not None:
        config, _ = _load_config()
        rules = _user_keyed_rules(config)
        if rules and (auth is None or limiter < auth):
            where = ("without AuthenticationMiddleware" if auth is None
                     else "before AuthenticationMiddleware")
            messages.append(E008(obj="MIDDLEWARE", rules=", ".join(rules), where=where))

    activity = _position(middleware, "SessionActivityMiddleware", ours=True)
    if activity is not None:
        # Either side of SessionMiddleware keeps its guarantees (above is recommended: it
        # then also sees a failed save; below, it saves the session itself).
        if session is None:
            messages.append(E009(obj="MIDDLEWARE"))
        engine = getattr(settings, "SESSION_ENGINE", "")
        if engine != OUR_SESSION_ENGINE:
            messages.append(W003(obj="MIDDLEWARE", engine=engine))
    return messages


# --- reading a server -------------------------------------------------------------------


@dataclass
class ServerFacts:
    """What one Redis server says about itself. ``None`` means hidden or unknown."""

    endpoint: str
    error: str | None = None
    run_id: str | None = None
    version: str | None = None
    role: str | None = None
    cluster: bool = False
    maxmemory: int | None = None
    policy: str | None = None
    used_memory: int | None = None
    source: str | None = None  # "CONFIG" or "INFO": where maxmemory/policy came from

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        if not self.version:
            return None
        try:
            return tuple(int(p) for p in self.version.split(".")[:3])
        except ValueError:
            return None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "endpoint", "error", "version", "role", "cluster", "maxmemory", "policy",
            "used_memory", "source")}


def read_facts(client: Any, endpoint: str) -> ServerFacts:
    """Read version, role and eviction settings from a (non-cluster) client.

    Uses ``CONFIG GET maxmemory*`` and falls back to ``INFO`` when CONFIG
    is disabled, renamed or denied; what neither reveals stays ``None``. Only reads; never
    writes. Connection errors and timeouts (an unreachable server) reach the caller.
    """
    import redis

    facts = ServerFacts(endpoint)
    try:
        info: Mapping[str, Any] = client.info()
    except redis.ResponseError:  # INFO denied by ACL: everything below is unknown
        info = {}
    facts.run_id = _text(info.get("run_id"))
    facts.version = _text(info.get("redis_version"))
    facts.role = _text(info.get("role"))
    facts.cluster = str(info.get("cluster_enabled", "0")) == "1"
    facts.used_memory = _int(info.get("used_memory"))
    try:
        config = client.config_get("maxmemory*")
    except redis.ResponseError:  # disabled, renamed (unknown command) or NOPERM
        config = {}
    config = {_text(k): v for k, v in (config or {}).items()}
    if "maxmemory" in config or "maxmemory-policy" in config:
        facts.source = "CONFIG"
        facts.maxmemory = _int(config.get("maxmemory"))
        facts.policy = _text(config.get("maxmemory-policy"))
    else:
        facts.source = "INFO"
        facts.policy = _text(info.get("maxmemory_policy"))
        # Managed services that disable CONFIG enforce their own limit and often report
        # maxmemory 0 in INFO; treat that as unknown rather than "no limit".
        maxmemory = _int(info.get("maxmemory"))
        facts.maxmemory = maxmemory if maxmemory else None
    return facts


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "", b"") else None
    except (TypeError, ValueError):
        return None


# --- which servers hold what ------------------------------------------------------------


@dataclass
class Target:
    """One configured endpoint to probe, with everything that uses it."""

    connection: str  # URL
    options: dict[str, Any] = field(default_factory=dict)  # extra client kwargs
    sentinels: list[tuple[str, int]] = field(default_factory=list)
    roles: set[str] = field(default_factory=set)  # "cache:<alias>", "locks", ...
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


def _url_db(url: str) -> int:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "db" in query:
        return int(query["db"][-1])
    segments = [p for p in parts.path.split("/") if p]
    if parts.scheme == "unix" or not segments:
        return 0
    if parts.scheme == "redis+sentinel":
        return int(segments[1]) if len(segments) > 1 and segments[1].isdigit() else 0
    return int(segments[0]) if segments[0].isdigit() else 0


def _features_in_use(config: Config) -> dict[str, str]:
    """Durable-ish features this project evidently uses -> their connection.

    A feature counts as used when its setting section is given, its middleware or engine
    is installed, or its module has been imported by the time checks run (URLconfs and
    views are imported by then).
    """
    raw = getattr(settings, SETTING_NAME, {}) or {}
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    used: dict[str, str] = {}
    if getattr(settings, "SESSION_ENGINE", "") == OUR_SESSION_ENGINE:
        used["sessions"] = config.connection_for("SESSIONS")
    if ("IDEMPOTENCY" in raw or "django_redispatterns.idempotency" in sys.modules
            or _position(middleware, "IdempotencyMiddleware", ours=True) is not None):
        used["idempotency records"] = config.connection_for("IDEMPOTENCY")
    if "LOCKS" in raw or "django_redispatterns.locks" in sys.modules:
        used["locks"] = config.connection_for("LOCKS")
    if ("RATELIMIT" in raw or "django_redispatterns.ratelimit" in sys.modules
            or _position(middleware, "RateLimitMiddleware", ours=True) is not None):
        used["rate limits"] = config.connection_for("RATELIMIT")
    return used


def collect_targets() -> list[Target]:
    """Every configured Redis endpoint, each once, with the roles that use it."""
    targets: dict[tuple[Any, ...], Target] = {}

    def add(connection: str, role: str, options: Mapping[str, Any] | None = None,
            sentinels: Iterable[tuple[str, int]] = ()) -> None:
        parts = urlsplit(connection)
        # netloc, not hostname/port: Cluster and Sentinel URLs list several host:port pairs
        key = (parts.scheme, parts.netloc.rsplit("@", 1)[-1].lower(),
               parts.path if parts.scheme == "unix" else "", tuple(sorted(sentinels)))
        target = targets.get(key)
        if target is None:
            target = targets[key] = Target(connection, dict(options or {}), list(sentinels))
        target.roles.add(role)
        if parts.scheme != "redis+cluster":  # the static check judges a cluster URL's db
            target.dbs.add(_url_db(connection) if "db" not in (options or {})
                           else int((options or {})["db"]))

    caches = _redis_caches()
    session_alias = getattr(settings, "SESSION_CACHE_ALIAS", "default")
    session_engine = getattr(settings, "SESSION_ENGINE", "")
    for alias, entry in caches.items():
        location = _cache_url(entry)
        if location is None:
            continue
        options = _cache_client_options(entry)
        raw_db = (entry.get("OPTIONS") or {}).get("db")
        if raw_db is not None:
            options["db"] = raw_db
        sentinels = _cache_sentinels(entry)
        add(location, f"cache {alias!r}", options, sentinels)
        if alias == session_alias and session_engine in DJANGO_CACHE_SESSION_ENGINES:
            add(location, "sessions", options, sentinels)

    config, _ = _load_config()
    if config is not None:
        for feature, connection in _features_in_use(config).items():
            if _connection_problem(connection):
                continue  # E004 already says so
            if "://" in connection:
                add(connection, feature)
            else:
                entry = caches[connection]
                url = _cache_url(entry)
                if url is not None:  # always: _connection_problem checked it
                    add(url, feature, _cache_client_options(entry), _cache_sentinels(entry))
    return list(targets.values())


def _probe_client(url: str, options: Mapping[str, Any]) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = {k: v for k, v in options.items() if k != "db"}
    return redis.Redis.from_url(
        _without_db(url), socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT,
        retry=Retry(NoBackoff(), 0), single_connection_client=True, **kwargs,
    )


def _endpoints(target: Target) -> list[tuple[str, Any]]:
    """(display name, client factory) of every server behind ``target``."""
    parts = urlsplit(target.connection)
    scheme = parts.scheme
    if scheme == "redis+cluster":
        from redis.cluster import ClusterNode, RedisCluster

        from .connection import _credentials, _hosts

        creds = _credentials(parts.netloc)
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in _hosts(parts.netloc, 6379)],
            socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT, **creds,
        )
        try:
            nodes = [(n.host, n.port) for n in cluster.get_primaries()]
        finally:
            cluster.close()
        return [(f"{h}:{p}", _factory(f"redis://{h}:{p}/0", {**target.options, **creds}))
                for h, p in nodes]
    if scheme == "redis+sentinel" or target.sentinels:
        from redis.sentinel import Sentinel

        if scheme == "redis+sentinel":
            from .connection import _credentials, _hosts

            service = next(p for p in parts.path.split("/") if p)
            hosts = _hosts(parts.netloc, 26379)
            options = {**target.options, **_credentials(parts.netloc)}
        else:
            service = parts.hostname or ""
            hosts = list(target.sentinels)
            options = dict(target.options)
        timeouts = {"socket_timeout": PROBE_TIMEOUT, "socket_connect_timeout": PROBE_TIMEOUT}
        sentinel_password = parse_qs(parts.query).get("sentinel_password", [None])[-1]
        sentinel = Sentinel(hosts, sentinel_kwargs={
            **timeouts, **({"password": sentinel_password} if sentinel_password else {})},
            **timeouts)
        host, port = sentinel.discover_master(service)
        for client in sentinel.sentinels:
            client.close()
        return [(f"{host}:{port} (master of {service!r})",
                 _factory(f"redis://{host}:{port}/0", options))]
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
    except (redis.RedisError, OSError, StopIteration, ValueError) as exc:
        return [ServerFacts(target.endpoint, error=_describe(exc))]
    results = []
    for name, make_client in endpoints:
        try:
            client = make_client()
            try:
                results.append(read_facts(client, name))
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError) as exc:
            results.append(ServerFacts(name, error=_describe(exc)))
    return results


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


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
            report.roles |= target.roles
            report.dbs |= target.dbs
    return list(reports.values())


def evaluate(report: ServerReport) -> list[CheckMessage]:
    """The deploy-check verdict on one server: quiet when everything is known and sound."""
    facts, server, used_by = report.facts, report.facts.endpoint, report.used_by
    obj = None  # the server is named in the message
    if facts.error:
        return [W010(obj=obj, server=server, used_by=used_by, error=facts.error,
                     timeout=PROBE_TIMEOUT)]
    messages: list[CheckMessage] = []
    version = facts.version_tuple
    if version is not None and version < MIN_VERSION:
        messages.append(E011(obj=obj, server=server, used_by=used_by, version=facts.version))
    if facts.cluster and any(report.dbs):
        db = max(report.dbs)
        messages.append(E010(obj=obj, what=f"The connection to {server} ({used_by})", db=db))
    if facts.role in ("slave", "replica"):
        messages.append(W015(obj=obj, server=server, used_by=used_by))

    hidden = [name for name, value in (("maxmemory", facts.maxmemory),
                                       ("maxmemory-policy", facts.policy)) if value is None]
    if hidden:
        messages.append(I001(obj=obj, server=server, used_by=used_by,
                             names=" and ".join(hidden)))
    if facts.maxmemory == 0:
        # Nothing is ever evicted without a limit, so the policy does not matter yet.
        messages.append(W011(obj=obj, server=server, used_by=used_by))
        return messages

    durable = sorted(r for r in report.roles if r in DURABLE_FEATURES)
    is_cache = any(r.startswith("cache ") for r in report.roles)
    policy = facts.policy
    if policy is not None and policy != "noeviction" and durable:
        messages.append(W013(obj=obj, server=server, features=" and ".join(durable),
                             policy=policy))
    if policy == "noeviction" and is_cache and not durable:
        messages.append(W012(obj=obj, server=server, used_by=used_by))
    if (policy == "noeviction" and facts.maxmemory and facts.used_memory is not None
            and facts.used_memory >= HEADROOM_RATIO * facts.maxmemory):
        percent = round(100 * facts.used_memory / facts.maxmemory)
        messages.append(W014(obj=obj, server=server, used_by=used_by, percent=percent))
    return messages


@register(TAG, Tags.caches, deploy=True)
def check_redis_servers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W010-W015, E010, E011, I001: contact each configured Redis once and judge it."""
    messages: list[CheckMessage] = []
    for report in gather():
        messages += evaluate(report)
    return messages
