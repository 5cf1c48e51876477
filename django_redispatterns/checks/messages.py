"""Every system-check message of the app, defined once: level, id, text and hint.

Each id is documented in ``docs/checks.md`` (a test keeps the two in step). Silence one
with ``SILENCED_SYSTEM_CHECKS = ["redispatterns.W012"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage, Error, Info, Warning

TAG = "redispatterns"

# The oldest Redis the app supports and is tested on.
MIN_VERSION = (6, 2, 0)
OUR_SESSION_ENGINE = "django_redispatterns.sessions"


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
    "{product} at {server} ({used_by}) is version {version}; django-redispatterns needs "
    f"Redis >= {'.'.join(map(str, MIN_VERSION))} (or any Valkey).",
    "Upgrade Redis (or use Valkey); 6.2 is the oldest version the app supports and is "
    "tested on.",
)
I001 = Message(
    Info, "I001", "Redis at {server} ({used_by}) hides {names}; not checked.",
    "CONFIG GET is unavailable and INFO does not report it (common on managed Redis). "
    "Make sure the provider's setting suits: noeviction where locks, sessions or "
    "idempotency records live, allkeys-lru for a pure cache.",
)

W016 = Message(
    Warning, "W016",
    "Redis at {server} holds {features} but keeps nothing on disk (appendonly no, save \"\").",
    "A restart or crash then forgets all of them: users are signed out, idempotent requests "
    "run their view a second time, and lock fencing tokens start over. Turn on AOF "
    "(appendonly yes) or RDB snapshots (e.g. save \"3600 1 300 100\") on this instance; an "
    "instance that only holds a cache needs neither.",
)
I002 = Message(
    Info, "I002",
    "Redis at {server} holds {features} but hides {names}; its persistence was not "
    "checked.",
    "CONFIG GET is unavailable (common on managed Redis). Make sure the provider keeps "
    "snapshots or an append-only file, or a restart forgets sessions, idempotency records "
    "and lock fencing counters.",
)
W021 = Message(
    Warning, "W021",
    "Redis at {server}: the user may not run {commands}, needed by {feature}.",
    "Grant the user the rights `manage.py redis_acl` prints (docs/security.md, \"Least "
    "privilege\"); until then every call of {feature} that sends it fails.",
)
I003 = Message(
    Info, "I003",
    "Could not tell which commands the Redis user of {server} may run ({used_by}): {why}.",
    "Compare the user's rights with what `manage.py redis_acl` prints "
    "(docs/security.md, \"Least privilege\").",
)
# --- settings the checks read (no network) --------------------------------------------
W017 = Message(
    Warning, "W017",
    "CACHES[{alias!r}] uses {factory}, which does not follow a graceful Sentinel failover.",
    "Its pooled connections keep writing to the old primary until Sentinel demotes it "
    "(about 10 s), and those writes are lost. Use "
    "django_redispatterns.connection.SentinelConnectionFactory (same options).",
)
W018 = Message(
    Warning, "W018",
    "CACHES[{alias!r}] unpickles what it reads from Redis ({serializer}).",
    "Anyone who can write to this Redis can then run code in your app. Unless only your "
    "app can ever write there, use django_redis.serializers.json.JSONSerializer or "
    "django_redis.serializers.msgpack.MSGPackSerializer (OPTIONS['SERIALIZER']; "
    "OPTIONS['serializer'] on Django's own backend).",
)
W019 = Message(
    Warning, "W019",
    "CACHES[{alias!r}]['KEY_FUNCTION'] {problem}.",
    "Keys of this cache then collide with those of other prefixes or versions (other "
    "caches, other sites, an earlier deploy), and clear() cannot tell its own keys from "
    "theirs, so it refuses to run. Build keys from key_prefix, version and key, like "
    "Django's default ':'.join([key_prefix, str(version), key]).",
)

E012 = Message(
    Error, "E012",
    "CACHES[{alias!r}]['OPTIONS'][{option!r}] is not an option {backend} reads.",
    "It would be ignored. Django-style options (db, socket_timeout, pool_class, ...) work "
    "on django_redispatterns.cache.RedisCache (django-redis's own backend ignores them); "
    "for the rest see docs/cache.md, \"Options\". Fix the spelling or remove it.",
)
W020 = Message(
    Warning, "W020",
    "CACHES[{alias!r}]['OPTIONS'][{option!r}] is not an option {backend} reads.",
    "Only the custom {custom} may read it; if it does not, the option is ignored. Fix the "
    "spelling or remove it.",
)
E013 = Message(
    Error, "E013", "CACHES[{alias!r}] cannot be used: {error}",
    "See docs/cache.md, \"Options\".",
)

# --- TLS ---------------------------------------------------------------------------------
W030 = Message(
    Warning, "W030",
    "Redis at {server} ({used_by}) presented a certificate that was refused: {error}",
    "Point REDIS_PATTERNS['TLS']['CA_CERTS'] at the PEM file of the CA that signed the "
    "server's certificate, and connect by a name (or IP address) the certificate lists. "
    "The connection is refused, never made without verification.",
)
W031 = Message(
    Warning, "W031",
    "TLS connections do not check the server's host name ({setting} is False).",
    "Any server holding a certificate from the same CA can pose as yours. Connect by a "
    "name the certificate lists and remove the setting.",
)

MESSAGES: tuple[Message, ...] = (
    E001, W001, E002, E003, E004, W002, W004, E008, E009, W003,
    W010, W011, W012, W013, W014, W015, E010, E011, I001, W016, I002, W017, W018, W019,
    E012, W020, E013, W021, I003, W030, W031,
)

