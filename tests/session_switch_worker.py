"""One web process of a mixed fleet, for tests/test_sessions_switch.py (no tests in here).

Run as ``python tests/session_switch_worker.py '<json options>'`` (a file path, so that the
checkout is not on ``sys.path``: in the previous release's venv, the installed release is
imported). Options: ``engine`` (SESSION_ENGINE), ``redis_url``, ``db`` (a SQLite file
shared by the fleet), ``key_prefix``, ``cache_prefix`` and optionally ``sessions`` (the
``REDIS_PATTERNS['SESSIONS']`` section), ``cache_url`` (the session cache's location, when
not ``redis_url``) and ``apps`` (more INSTALLED_APPS). Then it reads one JSON request a
line from stdin and answers one JSON line: ``{"method", "path", "data", "cookie"}`` ->
``{"status", "body", "cookie"}``, where ``cookie`` is the session cookie sent back
(``""``: deleted, absent: unchanged).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def configure(options: dict[str, Any]) -> None:
    from django.conf import settings

    sessions = options.get("sessions") or {}
    cache_url = options.get("cache_url") or options["redis_url"]
    settings.configure(
        SECRET_KEY="django-redispatterns-tests-not-secret",
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        USE_TZ=True,
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions", *options.get("apps", [])],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": options["db"],
                               "OPTIONS": {"timeout": 30}}},
        CACHES={"default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": cache_url,
            "KEY_PREFIX": options["cache_prefix"],
            "OPTIONS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        }},
        SESSION_ENGINE=options["engine"],
        SESSION_REDIS={"host": "127.0.0.1", "port": int(options["redis_url"].rsplit(":", 1)[1]
                                                        .split("/")[0]),
                       "db": 0, "prefix": options["cache_prefix"] + "rs"},
        REDIS_PATTERNS={"CONNECTION": options["redis_url"], "KEY_PREFIX": options["key_prefix"],
                        **({"SESSIONS": sessions} if sessions else {})},
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware"],
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        LOGGING_CONFIG=None,
    )


def whoami(request: Any) -> Any:
    from django.http import JsonResponse

    user = request.user
    return JsonResponse({"user": user.get_username() if user.is_authenticated else None,
                         "data": request.session.get("data"),
                         "key": request.session.session_key})


def everywhere(request: Any) -> Any:
    """logout_everywhere of the signed-in user; ``?keep=1`` keeps this session."""
    from django.http import JsonResponse

    from django_redispatterns.sessions import logout_everywhere

    keep = request.session.session_key if request.GET.get("keep") else None
    count = logout_everywhere(request.user, keep=keep)
    return JsonResponse({"revoked": int(count),
                         "complete": getattr(count, "complete", True)})


def listed(request: Any) -> Any:
    from django.http import JsonResponse

    from django_redispatterns.sessions import user_sessions

    return JsonResponse({"count": len(user_sessions(request.user))})


def where(request: Any) -> Any:
    """Where this process imports this package from (the previous release's venv or not)."""
    from django.http import JsonResponse

    import django_redispatterns

    return JsonResponse({"file": django_redispatterns.__file__})


def urls() -> list[Any]:
    from django.urls import path

    # The suite's own views (appended to sys.path: the installed release stays first).
    sys.path.append(str(Path(__file__).resolve().parent.parent))
    from tests.urls_sessions import do_login, write

    return [path("whoami/", whoami), path("write/<str:value>/", write),
            path("login/", do_login), path("everywhere/", everywhere),
            path("sessions/", listed), path("where/", where)]


def serve(options: dict[str, Any]) -> None:
    configure(options)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    global urlpatterns
    urlpatterns = urls()
    call_command("migrate", run_syncdb=True, verbosity=0)
    if options.get("user"):
        from django.contrib.auth.models import User

        if not User.objects.filter(username=options["user"]).exists():
            User.objects.create_user(options["user"], password="pw")
    name = settings.SESSION_COOKIE_NAME
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        client = Client(raise_request_exception=False)
        if request.get("cookie"):
            client.cookies[name] = request["cookie"]
        method = getattr(client, request.get("method", "get"))
        response = method(request["path"], request.get("data") or {})
        answer: dict[str, Any] = {"status": response.status_code}
        try:
            answer["body"] = json.loads(response.content)
        except ValueError:
            answer["body"] = response.content.decode(errors="replace")[-500:]
        if name in response.cookies:
            answer["cookie"] = response.cookies[name].value
        print(json.dumps(answer), flush=True)


urlpatterns: list[Any] = []

if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
