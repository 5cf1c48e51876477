"""Deploy checks (``check --deploy``): contact each configured Redis once and judge it."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Tags, register

from .messages import (
    E010,
    E011,
    I001,
    I002,
    I003,
    MIN_VERSION,
    TAG,
    W010,
    W011,
    W012,
    W013,
    W014,
    W015,
    W016,
    W021,
    W030,
    W031,
)
from .project import redis_caches
from .targets import PROBE_TIMEOUT, ServerReport, gather

# A noeviction instance this full starts refusing writes soon.
HEADROOM_RATIO = 0.9
# Features whose data must never be evicted (their keys all have TTLs, so volatile-*
# policies evict them too). Rate-limit counters are not listed: losing one resets a
# window early, which is the cache-like failure a limiter can live with.
DURABLE_FEATURES = ("locks", "sessions", "idempotency records")


def evaluate(report: ServerReport) -> list[CheckMessage]:
    """The deploy-check verdict on one server: quiet when everything is known and sound."""
    facts, server, used_by = report.facts, report.facts.endpoint, report.used_by
    obj = None  # the server is named in the message
    if facts.error and refused_certificate(facts.error):
        return [W030(obj=obj, server=server, used_by=used_by, error=facts.error)]
    if facts.error:
        return [W010(obj=obj, server=server, used_by=used_by, error=facts.error,
                     timeout=PROBE_TIMEOUT)]
    messages: list[CheckMessage] = []
    version = facts.version_tuple
    if version is not None and version < MIN_VERSION:
        messages.append(E011(obj=obj, server=server, used_by=used_by, version=facts.version,
                             product=facts.product))
    if facts.cluster and any(report.dbs):
        db = max(report.dbs)
        messages.append(E010(obj=obj, what=f"The connection to {server} ({used_by})", db=db))
    if facts.role in ("slave", "replica"):
        messages.append(W015(obj=obj, server=server, used_by=used_by))

    messages += _rights(report)
    durable = sorted(r for r in report.roles if r in DURABLE_FEATURES)
    messages += _persistence(report, durable)

    hidden = [name for name, value in (("maxmemory", facts.maxmemory),
                                       ("maxmemory-policy", facts.policy)) if value is None]
    if hidden:
        messages.append(I001(obj=obj, server=server, used_by=used_by,
                             names=" and ".join(hidden)))
    if facts.maxmemory == 0:
        # Nothing is ever evicted without a limit, so the policy does not matter yet.
        messages.append(W011(obj=obj, server=server, used_by=used_by))
        return messages

    is_cache = any(r.startswith("cache ") for r in report.roles)
    policy = facts.policy
    if policy is not None and policy != "noeviction" and durable:
        messages.append(W013(obj=obj, server=server, features=" and ".join(durable),
                             policy=policy))
    if policy == "noeviction" and is_cache and not durable:
        messages.append(W012(obj=obj, server=server, used_by=used_by))
    if (policy == "noeviction" and facts.maxmemory and facts.used_memory is not None
            and facts.used_memory >= HEADROOM_RATIO * facts.maxmemory):
        percent = round(100 * facts.used_memory / facts.maxmemory)
        messages.append(W014(obj=obj, server=server, used_by=used_by, percent=percent))
    return messages


def refused_certificate(error: str) -> bool:
    """True when a connection failed because the server's certificate did not verify."""
    return "CERTIFICATE_VERIFY_FAILED" in error or "certificate verify failed" in error


def hostname_checks_off() -> list[CheckMessage]:
    """W031: TLS without the host name check, in REDIS_PATTERNS or a CACHES entry."""
    from ..conf import get_config

    messages = []
    if not get_config().tls["CHECK_HOSTNAME"]:
        messages.append(W031(setting="REDIS_PATTERNS['TLS']['CHECK_HOSTNAME']"))
    for alias, entry in redis_caches().items():
        pool_kwargs = (entry.get("OPTIONS") or {}).get("CONNECTION_POOL_KWARGS") or {}
        if pool_kwargs.get("ssl_check_hostname") is False:
            messages.append(W031(setting=f"CACHES[{alias!r}]['OPTIONS']"
                                         "['CONNECTION_POOL_KWARGS']['ssl_check_hostname']"))
    return messages


def _persistence(report: ServerReport, durable: list[str]) -> list[CheckMessage]:
    """W016/I002: durable data on an instance that may keep nothing on disk. A cache-only
    instance needs no persistence; rate-limit counters can start over."""
    facts = report.facts
    if not durable or facts.aof or facts.rdb:
        return []
    features = " and ".join(durable)
    if facts.aof is False and facts.rdb is False:
        return [W016(server=facts.endpoint, features=features)]
    hidden = [name for name, value in (("appendonly", facts.aof),
                                       ("its RDB snapshot settings (save)", facts.rdb))
              if value is None]
    return [I002(server=facts.endpoint, features=features, names=" and ".join(hidden))]


def _rights(report: ServerReport) -> list[CheckMessage]:
    """W021 per feature whose user lacks a command it needs; I003 when that is unknown."""
    facts = report.facts
    if facts.rights_unknown is not None:
        return [I003(server=facts.endpoint, used_by=report.used_by, why=facts.rights_unknown)]
    by_feature: dict[str, list[str]] = {}
    for feature, command in facts.missing or ():
        by_feature.setdefault(feature, []).append(command)
    return [W021(server=facts.endpoint, feature=feature, commands=", ".join(commands))
            for feature, commands in sorted(by_feature.items())]


@register(TAG, Tags.caches, deploy=True)
def check_redis_servers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W010-W016, W021, E010, E011, I001-I003, W030: contact each configured Redis once and
    judge it; W031: TLS without the host name check."""
    messages: list[CheckMessage] = []
    for report in gather():
        messages += evaluate(report)
    return messages + hostname_checks_off()
