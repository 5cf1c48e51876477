"""Views for the idempotency tests, and the helpers the test modules share.

Every view counts its runs in Redis (works across processes) so a test can tell how often a
view really ran. Process workers live here (module level) so spawned children can import them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import redis
from django.conf import settings
from django.http import (
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.test import Client
from django.test.utils import override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework.authentication import BaseAuthentication
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redispatterns.idempotency import idempotent, idempotent_exempt
from tests.redis_servers import KEY_PREFIX, raw_client

COUNTER = f"{KEY_PREFIX}:idem-test:runs:"  # one counter per view name (TTL set on every INCR)


def runs(client: redis.Redis, name: str) -> int:
    return int(client.get(COUNTER + name) or 0)


def _count(name: str) -> None:
    client = raw_client(settings.REDIS_URL, socket_timeout=5)
    with client.pipeline() as pipe:
        pipe.incr(COUNTER + name)
        pipe.expire(COUNTER + name, 300)
        pipe.execute()
    client.close()


def header_scope(request: HttpRequest) -> str | None:
    """Tests name the caller in ``X-Test-User`` (no database needed in child processes)."""
    return request.headers.get("X-Test-User")


def _behave(request: HttpRequest, name: str) -> HttpResponse:
    q = request.GET
    if "raise" in q:
        _count(name)
        raise RuntimeError("the view failed")
    _count(name)
    status = int(q.get("status", 201))
    multipart = request.content_type.startswith("multipart/")
    got = dict(request.POST) if multipart else request.body.decode("latin-1")
    body = {"view": name, "run": time.time_ns(), "got": got}
    response = JsonResponse(body, status=status)
    response["Location"] = "/orders/42"
    response["X-Custom"] = "kept"
    response.set_cookie("sessionish", "secret-cookie")
    return response


def charge(request: HttpRequest) -> HttpResponse:
    _count(request.GET.get("name", "charge") + ":start")
    if "sleep" in request.GET:
        time.sleep(float(request.GET["sleep"]))
    return _behave(request, request.GET.get("name", "charge"))


async def acharge(request: HttpRequest) -> HttpResponse:
    _count(request.GET.get("name", "acharge") + ":start")
    if "sleep" in request.GET:
        await asyncio.sleep(float(request.GET["sleep"]))
    # _count is sync I/O: fine in a test view.
    return _behave(request, request.GET.get("name", "acharge"))


def binary(request: HttpRequest) -> HttpResponse:
    _count("binary")
    body = bytes(range(256)) + b"\xff\xfe\x00\n\r" + str(time.time_ns()).encode()
    return HttpResponse(body, status=202, content_type="application/octet-stream")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    _count("stream")
    return StreamingHttpResponse(iter([b"a", b"b", str(time.time_ns()).encode()]))


def big(request: HttpRequest) -> HttpResponse:
    _count("big")
    return HttpResponse(b"x" * int(request.GET.get("n", 100)))


@idempotent(required=True, ttl=7, methods=["POST", "PUT"], scope=header_scope)
def decorated(request: HttpRequest) -> HttpResponse:
    return charge(request)


@idempotent(scope=header_scope)
async def adecorated(request: HttpRequest) -> HttpResponse:
    return await acharge(request)


@idempotent(scope=header_scope)
def templated(request: HttpRequest) -> TemplateResponse:
    _count("templated")
    from django.template import engines

    template = engines["django"].from_string("rendered {{ n }}")
    return TemplateResponse(request, template, {"n": time.time_ns()}, status=201)


@idempotent_exempt
def exempt(request: HttpRequest) -> HttpResponse:
    _count("exempt")
    return HttpResponse(json.dumps({"n": time.time_ns()}), status=201)


# --- DRF: token-style auth that only DRF knows about; the decorator sees DRF's user ----------


class _ApiUser:
    is_authenticated = True

    def __init__(self, pk: str) -> None:
        self.pk = pk


class HeaderAuthentication(BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[_ApiUser, None] | None:
        name = request.META.get("HTTP_X_API_USER")
        return (_ApiUser(name), None) if name else None


class DrfCharge(APIView):
    authentication_classes = [HeaderAuthentication]
    permission_classes: list[Any] = []

    @method_decorator(idempotent(required=True))
    def post(self, request: Any) -> Response:
        _count("drf")
        return Response({"got": request.data, "user": request.user.pk, "n": time.time_ns()},
                        status=201)


# --- exit paths that must still settle the claim ---------------------------------------------
# One view per way a request can end; ``settled/`` (decorated) and ``plain/`` (the middleware)
# serve the same views. ``?how=`` picks the ending: ``render`` (a lazily rendered response whose
# rendering raises after the view returned), ``none`` (the view returns None), ``raise``,
# ``500``, ``ok`` (a final 201), ``template`` (a lazy response rendered fine); ``?sleep=`` makes
# the async view long, to be cancelled.


class _Boom:
    @property
    def x(self) -> str:
        raise RuntimeError("the template failed while rendering")


def _ending(request: HttpRequest, name: str) -> Any:
    _count(name)
    how = request.GET.get("how", "")
    if how == "none":
        return None
    if how == "raise":
        raise RuntimeError("the view failed")
    if how in ("500", "ok"):
        status = 500 if how == "500" else 201
        return JsonResponse({"view": name, "n": time.time_ns()}, status=status)
    from django.template import engines

    template = engines["django"].from_string("rendered {{ n }} {{ boom.x }}" if how == "render"
                                            else "rendered {{ n }}")
    return TemplateResponse(request, template, {"n": time.time_ns(), "boom": _Boom()},
                            status=201)


def ending(request: HttpRequest) -> Any:
    return _ending(request, "ending")


async def aending(request: HttpRequest) -> Any:
    if "sleep" in request.GET:
        _count("aending:start")
        await asyncio.sleep(float(request.GET["sleep"]))
    return _ending(request, "aending")


class DrfRenderFails(APIView):
    """DRF renders a ``Response`` after the view: this one cannot be rendered as JSON."""

    authentication_classes = [HeaderAuthentication]
    permission_classes: list[Any] = []

    @method_decorator(idempotent(required=True))
    def post(self, request: Any) -> Response:
        _count("drf-render")
        return Response({"not json": object()}, status=201)


class RaisingTemplateMiddleware:
    """A ``process_template_response`` that fails: the view's response is never rendered."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_template_response(self, request: HttpRequest, response: Any) -> Any:
        if "fail-template-middleware" in request.GET:
            raise RuntimeError("process_template_response failed")
        return response


urlpatterns = [
    path("settled/sync/", idempotent(scope=header_scope)(ending)),
    path("settled/async/", idempotent(scope=header_scope)(aending)),
    path("plain/sync/", ending),
    path("plain/async/", aending),
    path("drf-render/", DrfRenderFails.as_view()),
    path("drf/", DrfCharge.as_view()),  # the middleware sees the decorated post() and steps aside
    path("charge/", charge),
    path("other/", charge),
    path("acharge/", acharge),
    path("binary/", binary),
    path("stream/", stream),
    path("big/", big),
    path("decorated/", decorated),
    path("adecorated/", adecorated),
    path("templated/", templated),
    path("exempt/", exempt),
]


# --- helpers for the test modules ------------------------------------------------------

# tests.settings is imported lazily: a spawned child must set REDIS_URL before it loads.


def idem_settings(top: dict[str, Any] | None = None, **idempotency: Any) -> override_settings:
    """The test project with IdempotencyMiddleware last and the header-named caller scope.

    ``idempotency`` overrides ``REDIS_PATTERNS['IDEMPOTENCY']``; ``top`` the top-level keys.
    """
    from tests import settings as base

    section = {"SCOPE": "tests.urls_idempotency.header_scope", **idempotency}
    return override_settings(
        ROOT_URLCONF="tests.urls_idempotency",
        MIDDLEWARE=[*base.MIDDLEWARE, "django_redispatterns.middleware.IdempotencyMiddleware"],
        REDIS_PATTERNS={**base.REDIS_PATTERNS, **(top or {}), "IDEMPOTENCY": section},
    )


def post(client: Client, url: str, key: str | None = "k1", user: str | None = "alice",
         data: Any = None, content_type: str = "application/json", **extra: Any) -> Any:
    headers = dict(extra.pop("headers", {}))
    if key is not None:
        headers["Idempotency-Key"] = key
    if user is not None:
        headers["X-Test-User"] = user
    method = extra.pop("method", "post")
    body = data if data is not None else '{"amount": 100}'
    return getattr(client, method)(url, body, content_type=content_type, headers=headers, **extra)


def child_setup(redis_url: str) -> None:
    """In a spawned process: talk to the parent's Redis, then start Django."""
    os.environ["REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def child_send(redis_url: str, url: str, key: str, barrier: Any, queue: Any,
               count: int = 1, **idempotency: Any) -> None:
    """Module-level process worker: wait at the barrier, send ``count`` identical requests."""
    child_setup(redis_url)
    with idem_settings(**idempotency):
        client = Client()
        barrier.wait(30)
        statuses = []
        for _ in range(count):
            response = post(client, url, key=key)
            statuses.append((response.status_code, response.get("Idempotent-Replayed")))
        queue.put(statuses)


def child_hold(redis_url: str, url: str, key: str, **idempotency: Any) -> None:
    """Module-level process worker: send one (slow) request; the parent kills us mid-view."""
    child_setup(redis_url)
    with idem_settings(**idempotency):
        post(Client(), url, key=key)


async def asgi_post(path: str, query: bytes = b"", *, key: str = "k1", user: str = "alice",
                    body: bytes = b'{"amount": 100}',
                    disconnect_when: Any = None) -> tuple[int | None, bytes]:
    """One POST through Django's ``ASGIHandler`` from a hand-made scope (raw query bytes).

    ``disconnect_when``: a zero-argument callable; once it is true the client hangs up
    (Django then cancels the view). Returns the status (None if nothing was sent) and body.
    """
    from django.core.handlers.asgi import ASGIHandler

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"idempotency-key", key.encode()), (b"x-test-user", user.encode())],
    }
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": body, "more_body": False})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    call = asyncio.ensure_future(ASGIHandler()(scope, receive, send))
    if disconnect_when is not None:
        deadline = time.monotonic() + 30
        while not disconnect_when() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        inbox.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(call, 60)
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
