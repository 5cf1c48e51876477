"""Rejecting stale lock holders in the store the lock protects."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet


def fenced_update(queryset: QuerySet[Any], fencing_token: int, *,
                  field: str = "fencing_token", **values: Any) -> bool:
    """``UPDATE ... SET <values>, <field> = token WHERE <field> < token`` in one statement.

    Returns True when the row(s) took the write; False when a holder with a token at least
    as high already wrote (so this caller's lease must have ended: stop working). The
    comparison runs inside the database, so two holders racing cannot both win.
    """
    stale = Q(**{f"{field}__lt": fencing_token}) | Q(**{f"{field}__isnull": True})
    return queryset.filter(stale).update(**values, **{field: fencing_token}) > 0
