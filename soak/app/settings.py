"""Settings of the soak app. The environment says where Redis and the files are:

``SOAK_REDIS_URL``, ``SOAK_DB`` (SQLite file), ``SOAK_RUNLOG`` (folder for the views' run
logs), ``SOAK_STACK`` (``ours`` or ``theirs``).
"""

from __future__ import annotations

import os

from soak import config

STACK = os.environ.get("SOAK_STACK", "ours")
REDIS_URL = os.environ.get("SOAK_REDIS_URL", "redis://127.0.0.1:6379/15")
RUNLOG = os.environ.get("SOAK_RUNLOG", "")

SECRET_KEY = "soak-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "soak.app.urls"
WSGI_APPLICATION = "soak.app.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "soak.app.apps.SoakAppConfig",
]
if STACK == "ours":
    INSTALLED_APPS.append("django_redispatterns")
else:
    INSTALLED_APPS.append("django_ratelimit")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SOAK_DB", "soak.sqlite3"),
        "OPTIONS": {"timeout": 20},
        # The benchmark keeps each thread's database connection, as production deployments
        # do (opening one per request would cost both stacks alike and blur the comparison).
        "CONN_MAX_AGE": 600 if os.environ.get("SOAK_BENCH") == "1" else 0,
    }
}
# Signing in is not what the soak measures: a cheap hasher keeps PBKDF2 off the CPU.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# What docs/install.md and docs/failure-modes.md say: bound every Redis call by a short
# socket timeout, and let the cache degrade (IGNORE_EXCEPTIONS) when Redis is unusable.
_REDIS_OPTIONS = {
    "SOCKET_TIMEOUT": config.SOCKET_TIMEOUT,
    "SOCKET_CONNECT_TIMEOUT": config.SOCKET_TIMEOUT,
    "IGNORE_EXCEPTIONS": True,
}
# The opt-in process memories ours may run with (``SOAK_MEMORY``, comma-separated):
# "sessions" (SESSIONS["NEAR_CACHE"]) and "cache" (the cache's OPTIONS["NEAR_CACHE"]).
MEMORY = {name for name in os.environ.get("SOAK_MEMORY", "").split(",") if name}
_BACKEND = ("django_redispatterns.cache.RedisCache" if STACK == "ours"
            else "django_redis.cache.RedisCache")
# On Redis Cluster (``./dev soak --cluster``) the cache builds its client from the
# ``redis+cluster://`` URL with the package's connection factory, as docs/scale.md shows.
_CLUSTER = REDIS_URL.startswith("redis+cluster://")
if _CLUSTER:
    _REDIS_OPTIONS["CONNECTION_FACTORY"] = "django_redispatterns.connection.ConnectionFactory"
CACHES = {
    alias: {
        "BACKEND": _BACKEND,
        "LOCATION": [REDIS_URL] if _CLUSTER else REDIS_URL,
        "TIMEOUT": 300,
        "KEY_PREFIX": f"soak-{alias}",
        "OPTIONS": ({**_REDIS_OPTIONS, "STALE_TTL": stale,
                     **({"NEAR_CACHE": True} if "cache" in MEMORY else {})}
                    if STACK == "ours" else dict(_REDIS_OPTIONS)),
    }
    for alias, stale in config.STALE_TTL.items()
}

if STACK == "ours":
    SESSION_ENGINE = "django_redispatterns.sessions"
    MIDDLEWARE = [
        "soak.app.middleware.TimingMiddleware",
        "django_redispatterns.middleware.SessionActivityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django_redispatterns.middleware.RateLimitMiddleware",
        "django_redispatterns.middleware.IdempotencyMiddleware",
    ]
    _path, _rate, _algorithm, _burst = config.rate_routes()["api_rule"]
    REDIS_PATTERNS = {
        "CONNECTION": "default",
        "KEY_PREFIX": "soak",
        "SOCKET_TIMEOUT": config.SOCKET_TIMEOUT,
        "SOCKET_CONNECT_TIMEOUT": config.SOCKET_TIMEOUT,
        "RATELIMIT": {"RULES": [{
            "path": "^/api/", "rate": _rate, "algorithm": _algorithm,
            "key": f"header:{config.BUCKET_HEADER}", "name": "api",
        }]},
        "IDEMPOTENCY": {"LEASE": config.IDEMPOTENCY_LEASE},
        "SESSIONS": {"NEAR_CACHE": "sessions" in MEMORY},
    }
else:
    SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    MIDDLEWARE = [
        "soak.app.middleware.TimingMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django_ratelimit.middleware.RatelimitMiddleware",  # RATELIMIT_VIEW: 429, not 403
    ]
    RATELIMIT_USE_CACHE = "default"
    RATELIMIT_VIEW = "soak.app.views.ratelimited"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_redispatterns": {"handlers": ["stderr"], "level": "WARNING"},
        "django.request": {"handlers": ["stderr"], "level": "ERROR"},
    },
}
