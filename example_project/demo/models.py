"""Models of the demo app."""

from __future__ import annotations

from django.db import models


class FencedReport(models.Model):
    """A row guarded by a lock's fencing token: it only accepts writes with a higher token.

    ``django_redispatterns.locks.fenced_update`` writes with
    ``UPDATE ... WHERE fencing_token < :token``, so a holder whose lease ended (a GC pause, a
    Redis failover) and who wakes up late cannot overwrite the newer holder's result.
    """

    name = models.CharField(max_length=100, unique=True)
    body = models.TextField(blank=True)
    fencing_token = models.BigIntegerField(default=0)
    written_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} (fencing token {self.fencing_token})"
