"""Settings of the example project: every feature of django-redispatterns switched on."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

if os.environ.get("REDIS_URL"):
    REDIS_URL = os.environ["REDIS_URL"]
else:
    from .embedded_redis import ensure_embedded_redis

    REDIS_URL = ensure_embedded_redis()

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redispatterns",
    # The "Log out everywhere" action on the user admin (ADMIN_LOGOUT_ACTION below).
    "django_redispatterns.contrib.devices",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Directly above SessionMiddleware: device metadata for "your sessions", and 503 with
    # the cookie kept when Redis is down.
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

CACHES = {
    "default": {
        # django-redis extended: TTL discipline and stampede protection (docs/cache.md).
        "BACKEND": "django_redispatterns.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "TIMEOUT": 300,
        "KEY_PREFIX": "demo-cache",
        # JSON, not pickle: a value in Redis is data, never code (check --deploy says why).
        "OPTIONS": {"STALE_TTL": 30, "TTL_JITTER": 0.1,
                    "SERIALIZER": "django_redis.serializers.json.JSONSerializer"},
    },
}

# Sessions in Redis with a per-user index ("your devices", log out everywhere).
SESSION_ENGINE = "django_redispatterns.sessions"

REDIS_PATTERNS = {
    "CONNECTION": "default",
    "KEY_PREFIX": "demo",
    # NEAR_CACHE: signed-in loads from process memory, kept correct by Redis tracking (a
    # revocation reaches every process within 0.5 s at worst; docs/sessions.md).
    "SESSIONS": {"ADMIN_LOGOUT_ACTION": True, "NEAR_CACHE": True},
}

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # templates/redispatterns/devices_base.html puts the devices page in the demo's layout.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"  # every time the demo shows is UTC, written and displayed
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_redispatterns": {"handlers": ["console"], "level": "INFO"}},
}
