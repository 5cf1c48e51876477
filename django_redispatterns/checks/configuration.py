"""Static checks of ``REDIS_PATTERNS``: malformed settings, rate-limit rules, connections."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, register

from ..conf import SETTING_NAME, Config
from ..connection import redact
from ..exceptions import ConfigurationError
from .messages import E002, E003, E004, E010, TAG
from .project import connection_problem, features_and_connections, load_config, url_db


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E002 (malformed REDIS_PATTERNS), E003 (bad rate-limit rules), E004, E010 (connections)."""
    config, messages = load_config()
    if config is None:
        return messages
    messages += _check_rules(config)
    messages += _check_session_near_cache(config)
    messages += _check_connections(config)
    return messages


def _check_rules(config: Config) -> list[CheckMessage]:
    rules = config.feature("RATELIMIT")["RULES"]
    if not rules:
        return []
    try:
        from ..ratelimit.rates import validate_rules
    except ImportError:  # the rate-limit feature is not installed in this build
        return []
    try:
        validate_rules(rules)
    except (ConfigurationError, TypeError, ValueError) as exc:
        return [E003(obj=SETTING_NAME, error=exc)]
    return []


def _check_session_near_cache(config: Config) -> list[CheckMessage]:
    from ..sessions.memory import read_settings

    try:
        read_settings(config)
    except ConfigurationError as exc:
        return [E002(error=str(exc), setting=SETTING_NAME)]
    return []


def _check_connections(config: Config) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    seen: set[str] = set()
    for label, connection in features_and_connections(config).items():
        if connection in seen:
            continue
        seen.add(connection)
        problem = connection_problem(connection)
        if problem:
            messages.append(E004(obj=SETTING_NAME, feature=label,
                                 connection=redact(connection), error=problem))
            continue
        if connection.startswith("redis+cluster://"):
            db = url_db(connection)
            if db:
                messages.append(E010(obj=SETTING_NAME,
                                     what=f"The connection {redact(connection)!r}", db=db))
    return messages


