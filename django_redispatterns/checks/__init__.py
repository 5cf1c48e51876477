"""System checks: what in the settings, or in the Redis server, will hurt in production.

Static checks run with every ``manage.py`` command and never touch the network
(:mod:`.cache`, :mod:`.configuration`, :mod:`.sessions`, :mod:`.middleware`). Deploy
checks (``manage.py check --deploy``, :mod:`.deploy`) contact each distinct Redis server
once, in parallel, with a short timeout (:mod:`.targets`, :mod:`.server`); an unreachable
server is a warning, never a crash or a hang. Settings are read with ``CONFIG GET`` and,
where that is disabled (managed Redis, ACLs, a renamed command), from ``INFO``; a value the
server hides is reported as unknown (an ``Info``), never as a problem.

Every message is defined once in :mod:`.messages` and documented in ``docs/checks.md``.
Importing this package registers the checks (the app config does it in ``ready()``).
"""

from __future__ import annotations

from .cache import (
    check_cache_key_functions,
    check_cache_sentinel_factories,
    check_cache_serializers,
    check_cache_ttls,
)
from .configuration import check_settings
from .deploy import check_redis_servers, evaluate
from .messages import (
    E001,
    E002,
    E003,
    E004,
    E008,
    E009,
    E010,
    E011,
    I001,
    I002,
    MESSAGES,
    MIN_VERSION,
    TAG,
    W001,
    W002,
    W003,
    W004,
    W010,
    W011,
    W012,
    W013,
    W014,
    W015,
    W016,
    W017,
    W018,
    W019,
    Message,
)
from .middleware import check_middleware_order
from .server import ServerFacts, read_facts
from .sessions import check_session_serializer
from .targets import PROBE_TIMEOUT, ServerReport, Target, collect_targets, gather, probe

__all__ = [
    "E001", "E002", "E003", "E004", "E008", "E009", "E010", "E011", "I001", "I002",
    "MESSAGES", "MIN_VERSION", "PROBE_TIMEOUT", "TAG", "W001", "W002", "W003", "W004",
    "W010", "W011", "W012", "W013", "W014", "W015", "W016", "W017", "W018", "W019",
    "Message", "ServerFacts", "ServerReport", "Target", "check_cache_key_functions",
    "check_cache_sentinel_factories", "check_cache_serializers", "check_cache_ttls",
    "check_middleware_order", "check_redis_servers",
    "check_session_serializer", "check_settings", "collect_targets", "evaluate", "gather",
    "probe", "read_facts",
]
