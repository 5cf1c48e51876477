"""RFC 9457 problem details: the one shape of every error answer this app produces.

Rate limiting (429/503), idempotency (400/409/422/503) and sessions (503) all answer with
``{"type", "title", "status", "code", "detail", ...}``; ``code`` is stable and
machine-readable, ``detail`` is for people.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from django.http import HttpResponse

PROBLEM_JSON = "application/problem+json"

# RFC 9110 renamed 422; Python < 3.13 still knows the old phrase.
_TITLES = {422: "Unprocessable Content"}


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    retry_after: int | None = None,
    problem_type: str = "about:blank",
    content_type: str = PROBLEM_JSON,
    **extra: Any,
) -> HttpResponse:
    """A JSON problem answer.

    With ``retry_after``, the body carries ``retry_after`` and the response a
    ``Retry-After`` header, both in whole seconds and at least 1.
    """
    if retry_after is not None:
        retry_after = max(1, int(retry_after))
        extra["retry_after"] = retry_after
    body = {
        "type": problem_type,
        "title": _TITLES.get(status) or HTTPStatus(status).phrase,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    response = HttpResponse(json.dumps(body), status=status, content_type=content_type)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
