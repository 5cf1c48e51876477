"""Static checks of MIDDLEWARE: our middleware placed where it cannot do its job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, register

from ..conf import Config
from .messages import E008, E009, OUR_SESSION_ENGINE, TAG, W003, W004
from .project import AUTH_MIDDLEWARE, CSRF_MIDDLEWARE, SESSION_MIDDLEWARE, load_config, position


def _user_keyed_rules(config: Config | None) -> list[str]:
    if config is None:
        return []
    found = []
    for index, rule in enumerate(config.feature("RATELIMIT")["RULES"]):
        if isinstance(rule, Mapping) and rule.get("key") in ("user", "user_or_ip"):
            found.append(f"#{index} {rule.get('path', '')!r}")
    return found


@register(TAG, Tags.security)
def check_middleware_order(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W004, E008, E009, W003: our middleware placed where it cannot do its job."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    auth = position(middleware, AUTH_MIDDLEWARE, ours=False)
    session = position(middleware, SESSION_MIDDLEWARE, ours=False)
    messages: list[CheckMessage] = []

    # Idempotency decides in process_view, after every middleware's request phase, so
    # request.user and request.session exist wherever it sits; what its position decides
    # is whose process_view refusals come after its claim.
    idem = position(middleware, "IdempotencyMiddleware", ours=True)
    csrf = position(middleware, CSRF_MIDDLEWARE, ours=False)
    if idem is not None and csrf is not None and idem < csrf:
        messages.append(W004(obj="MIDDLEWARE", blocker="CsrfViewMiddleware"))

    limiter = position(middleware, "RateLimitMiddleware", ours=True)
    if limiter is not None:
        config, _ = load_config()
        rules = _user_keyed_rules(config)
        if rules and (auth is None or limiter < auth):
            where = ("without AuthenticationMiddleware" if auth is None
                     else "before AuthenticationMiddleware")
            messages.append(E008(obj="MIDDLEWARE", rules=", ".join(rules), where=where))

    activity = position(middleware, "SessionActivityMiddleware", ours=True)
    if activity is not None:
        # Either side of SessionMiddleware keeps its guarantees (above is recommended: it
        # then also sees a failed save; below, it saves the session itself).
        if session is None:
            messages.append(E009(obj="MIDDLEWARE"))
        engine = getattr(settings, "SESSION_ENGINE", "")
        if engine != OUR_SESSION_ENGINE:
            messages.append(W003(obj="MIDDLEWARE", engine=engine))
    return messages


