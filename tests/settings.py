"""Django settings for the test suite. The Redis URL and the key prefixes (one per xdist
worker and run, ``rptest-<run>-<worker>``) come from tests.redis_servers."""

from __future__ import annotations

import os
from typing import Any

from tests.redis_servers import CACHE_PREFIX, KEY_PREFIX, TLS_ENV, main_redis_url

REDIS_URL = main_redis_url() or "redis://127.0.0.1:1/0"  # unreachable: Redis tests skip

# A rediss:// REDIS_URL takes its certificates from REDIS_TLS_CA_CERTS, REDIS_TLS_CERTFILE,
# REDIS_TLS_KEYFILE and REDIS_TLS_KEY_PASSWORD (REDIS_PATTERNS["TLS"]'s CA_CERTS, CERTFILE,
# KEYFILE and KEY_PASSWORD).
_TLS_KEYS = {"ssl_ca_certs": "CA_CERTS", "ssl_certfile": "CERTFILE", "ssl_keyfile": "KEYFILE",
             "ssl_password": "KEY_PASSWORD"}
TLS: dict[str, Any] = {_TLS_KEYS[keyword]: os.environ[name]
                       for keyword, name in TLS_ENV.items() if os.environ.get(name)}
# django-redis's own backend gets them through the app's connection factory.
TLS_OPTIONS = ({"CONNECTION_FACTORY": "django_redispatterns.connection.ConnectionFactory"}
               if REDIS_URL.startswith("rediss://") else {})

# Connecting includes the TLS handshake over rediss://: the suite's tests that open tens to
# hundreds of connections at once need longer than 2 s for it on a loaded machine.
CONNECT_TIMEOUT = 15 if REDIS_URL.startswith("rediss://") else 2

SECRET_KEY = "django-redispatterns-tests-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django_redispatterns",
    "tests.testapp",
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CACHE_PREFIX,
        "TIMEOUT": 300,
        "OPTIONS": {"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT, **TLS_OPTIONS},
    },
    # The cache feature's backend (tests/test_cache*.py).
    "patterns": {
        "BACKEND": "django_redispatterns.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CACHE_PREFIX,
        "TIMEOUT": 300,
        "OPTIONS": {"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT},
    },
}

REDIS_PATTERNS = {
    "CONNECTION": "default",
    "KEY_PREFIX": KEY_PREFIX,
    "TLS": TLS,
}
if TLS:
    # The run's defaults too, so that tests overriding REDIS_PATTERNS as a whole (and the
    # child processes some tests spawn, which load these settings) keep them.
    from django_redispatterns.conf import SCHEMA

    for _key, _value in TLS.items():
        SCHEMA["TLS"][_key] = (SCHEMA["TLS"][_key][0], _value)

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.contrib.auth.context_processors.auth"]},
    }
]

STATIC_URL = "/static/"  # pytest-django's live server (tests/test_devices_browser.py) needs one
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGGING_CONFIG = None
