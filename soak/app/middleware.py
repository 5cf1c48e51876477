"""The soak's only hook: which worker answered and how long the request spent in Django."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class TimingMiddleware:
    """Outermost: ``X-Soak-Worker`` (pid) and ``X-Soak-Elapsed`` (seconds inside Django)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        started = time.perf_counter()
        return self.stamp(self.get_response(request), started)

    async def __acall__(self, request: Any) -> Any:
        started = time.perf_counter()
        return self.stamp(await self.get_response(request), started)

    @staticmethod
    def stamp(response: Any, started: float) -> Any:
        response["X-Soak-Worker"] = str(os.getpid())
        response["X-Soak-Elapsed"] = f"{time.perf_counter() - started:.4f}"
        return response
