"""``manage.py ratelimit inspect|reset``: look at or unblock one client of one limit.

Name the limit by a middleware rule (``--rule 0`` or ``--rule <name>``), a decorated view
(``--view myapp.views.login`` plus its ``--rate``/``--algorithm``), or in full
(``--rate 5/m --algorithm sliding_window --group G``); name the client with ``--key`` (the
rule's key kind, e.g. ``ip``, ``user``, ``header:X-Api-Key``) and ``--identity`` (an IP, a
user pk, a header value). Inspecting counts nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...conf import get_config
from ...exceptions import ConfigurationError
from ...ratelimit.identity import identity_for
from ...ratelimit.limiter import RateLimiter
from ...ratelimit.rates import DEFAULT_ALGORITHM, validate_rules
from ..base import RedisCommand


class Command(RedisCommand):
    help = "Inspect or reset the rate-limit state of one client (IP, user, header value)."
    feature = "RATELIMIT"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["inspect", "reset"])
        parser.add_argument("--identity", required=True,
                            help="The client: an IP address, a user pk, a header value.")
        parser.add_argument("--rule", help="Index or name of a RATELIMIT['RULES'] entry.")
        parser.add_argument("--view", help="Dotted name of a @ratelimit-decorated view.")
        parser.add_argument("--group", help="Counter group (default: from --rule/--view).")
        parser.add_argument("--rate", help="Rate such as 5/m (not needed with --rule).")
        parser.add_argument("--algorithm", default=None)
        parser.add_argument("--burst", type=int, default=None)
        parser.add_argument("--key", default=None, help="Key kind: ip, user, header:<Name>...")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            limiter, key = self._limiter(options)
            identity = identity_for(key, options["identity"])
        except (ConfigurationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if options["action"] == "reset":
            existed = limiter.reset(identity)
            self.stdout.write(f"reset {limiter.key(identity)}: "
                              f"{'cleared' if existed else 'nothing stored'}")
            return
        decision = limiter.peek(identity)
        self.stdout.write(f"key        {limiter.key(identity)}")
        self.stdout.write(f"limit      {decision.limit} per {limiter.rate.period}s "
                          f"({limiter.algorithm.name})")
        self.stdout.write(f"remaining  {decision.remaining}")
        self.stdout.write(f"reset in   {decision.reset_after:.1f}s")
        state = "allowed" if decision.allowed else f"BLOCKED, retry in {decision.retry_after:.1f}s"
        self.stdout.write(f"next hit   {state}")

    def _limiter(self, options: dict[str, Any]) -> tuple[RateLimiter, str]:
        if options["rule"] is not None:
            rules = list(get_config().feature("RATELIMIT")["RULES"])
            validate_rules(rules)
            spec = self._find_rule(rules, options["rule"])
            index = rules.index(spec)
            name = spec.get("name")
            group = (options["group"] or spec.get("group") or name
                     or f"rule:{index}:{spec.get('path', '')}")
            limiter = RateLimiter(spec["rate"], algorithm=spec.get("algorithm", DEFAULT_ALGORITHM),
                                  burst=spec.get("burst"), group=group, name=name)
            key = spec.get("key", "ip")
            return limiter, key if isinstance(key, str) else "callable"
        if not options["rate"]:
            raise ConfigurationError("give --rule, or --rate with --view or --group")
        group = options["group"] or options["view"]
        if not group:
            raise ConfigurationError("give --view (the decorated view's dotted name) or --group")
        limiter = RateLimiter(options["rate"], algorithm=options["algorithm"] or DEFAULT_ALGORITHM,
                              burst=options["burst"], group=group)
        return limiter, options["key"] or "ip"

    @staticmethod
    def _find_rule(rules: list[Any], wanted: str) -> Any:
        for i, rule in enumerate(rules):
            if wanted == str(i) or wanted == rule.get("name"):
                return rule
        raise ConfigurationError(f"no RATELIMIT rule {wanted!r} (give an index or a name)")
