"""Cache demo: an expensive report behind ``@cached``, a button that expires it, and a
stampede of 20 threads against one cold key — ours computes once, Django's default
``get_or_set`` algorithm (get, compute, add) computes for nearly every thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.base import BaseCache
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods

from django_redispatterns.cache import RedisCache, cached, invalidate_on_commit

COMPUTES = "demo:report:computes"
THREADS = 20


def _count_compute() -> int:
    return int(cache.incr(COMPUTES, ignore_key_check=True))


@cached(timeout=30, key="demo:report:{0}")
def report(region: str) -> dict[str, Any]:
    """Pretend this is a slow aggregate query (0.5 s)."""
    _count_compute()
    time.sleep(0.5)
    return {"region": region, "total": 1234, "computed_at": time.strftime("%H:%M:%S")}


def _stampede(get_or_set: Any) -> tuple[int, float]:
    cache.delete("demo:stampede")
    runs: list[int] = []
    lock = threading.Lock()

    def compute() -> str:
        with lock:
            runs.append(1)
        time.sleep(0.3)
        return "value"

    barrier = threading.Barrier(THREADS)

    def caller() -> None:
        barrier.wait()
        get_or_set("demo:stampede", compute, 30)

    threads = [threading.Thread(target=caller) for _ in range(THREADS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(runs), time.monotonic() - started


def _lifetime(ttl: int | None) -> dict[str, Any]:
    """Split the key's Redis TTL into the fresh part and the stale window kept after it."""
    stale = int(settings.CACHES["default"].get("OPTIONS", {}).get("STALE_TTL", 0))
    left = max(int(ttl or 0), 0)
    return {"fresh_for": max(left - stale, 0), "stale_for": min(left, stale), "stale_ttl": stale}


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if request.POST.get("action") == "expire":
            with transaction.atomic():
                # ... write the rows the report reads, then: delete after the commit.
                invalidate_on_commit(report.cache_key("eu"))  # type: ignore[attr-defined]
        elif request.POST.get("action") == "stampede":
            ours, ours_s = _stampede(cache.get_or_set)
            plain, plain_s = _stampede(lambda *a: BaseCache.get_or_set(cache, *a))
            request.session["stampede"] = {"ours": ours, "ours_s": round(ours_s, 2),
                                           "plain": plain, "plain_s": round(plain_s, 2)}
        return redirect("cache:index")
    started = time.monotonic()
    data = report("eu")
    return render(request, "demo/cache.html", {
        "report": data,
        "seconds": round(time.monotonic() - started, 3),
        "computes": cache.get(COMPUTES, 0),
        **_lifetime(cache.ttl(report.cache_key("eu"))),  # type: ignore[attr-defined]
        "ours": isinstance(caches["default"], RedisCache),
        "stampede": request.session.pop("stampede", None),
        "threads": THREADS,
    })


urlpatterns = [path("", index, name="index")]
