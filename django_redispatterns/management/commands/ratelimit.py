"""``manage.py ratelimit inspect|reset``: look at or unblock one client of one limit.

Name the limit by a middleware rule (``--rule 0`` or ``--rule <name>``), by a decorated
view (``--view myapp.views.login``: the command reads the decorator's own rules — rate,
algorithm, burst, group, key — so it addresses exactly the keys the view uses, and refuses
a view that does not exist or is not decorated), or in full (``--group G --rate 5/m
[--algorithm A] [--burst B] [--key K]``). Name the client with ``--identity`` (an IP, a
user pk, a header value, what a callable key returns). Inspecting counts nothing.
"""

from __future__ import annotations

import copy
import inspect as pyinspect
from collections.abc import Iterable
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.module_loading import import_string

from ...conf import get_config
from ...exceptions import ConfigurationError
from ...middleware.ratelimit import compile_rules
from ...ratelimit.decorators import RULES_ATTR
from ...ratelimit.identity import identity_for
from ...ratelimit.limiter import RateLimiter
from ...ratelimit.rates import ALGORITHMS, DEFAULT_ALGORITHM, parse_rate
from ...ratelimit.rules import Rule
from ..base import RedisCommand

HANDLERS = ("dispatch", "get", "post", "put", "patch", "delete", "head", "options", "trace")

Target = tuple[RateLimiter, str, str]  # (limiter, key kind, where it comes from)


class Command(RedisCommand):
    feature = "RATELIMIT"
    help = ("Inspect or reset the rate-limit state of one client (an IP, a user, a header "
            "value) under one limit: a RATELIMIT['RULES'] entry (--rule), the "
            "@ratelimit rules of a view (--view), or a limit named in full (--group and "
            "--rate).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", choices=["inspect", "reset"],
            help="inspect: print the client's state (limit, remaining, reset, whether its "
                 "next hit would pass) without counting anything. reset: delete the "
                 "client's counter so its next request starts a fresh budget (one DEL; "
                 "no KEYS, no scan).")
        parser.add_argument("--identity", required=True,
                            help="The client: an IP address (IPv6 is grouped the way "
                                 "requests are), a user pk, a header value, or what a "
                                 "callable key returns.")
        parser.add_argument("--rule", help="Index or name of a RATELIMIT['RULES'] entry.")
        parser.add_argument("--view", help="Dotted path of a @ratelimit-decorated view "
                                           "(a function, or a class with decorated "
                                           "methods).")
        parser.add_argument("--group", help="Counter group of a limit named in full (with "
                                            "--rate); not with --rule or --view, whose "
                                            "group is their own.")
        parser.add_argument("--rate", help="Rate such as 5/m. With --view: pick the rule "
                                           "of that rate (needed for a callable rate: the "
                                           "client's tier).")
        parser.add_argument("--algorithm", choices=ALGORITHMS, default=None,
                            help="Counting algorithm of the limit (default fixed_window "
                                 "for a limit named in full; with --view or --rule: pick "
                                 "or check the rule's).")
        parser.add_argument("--burst", type=int, default=None,
                            help="Bucket size of a token_bucket limit (default: the "
                                 "rate's count); part of the key, so give the rule's "
                                 "value. Only for --algorithm token_bucket.")
        parser.add_argument("--key", default=None,
                            help="Key kind: ip, user, user_or_ip, header:<Name>, "
                                 "callable (default ip for a limit named in full; "
                                 "with --view or --rule: checked against the rule's).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            targets = self._targets(options)
            resolved = [(limiter, identity_for(key, options["identity"]), where)
                        for limiter, key, where in targets]
        except (ConfigurationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        for limiter, identity, where in resolved:
            if options["action"] == "reset":
                existed = limiter.reset(identity)
                self.stdout.write(f"reset {limiter.key(identity)} ({where}): "
                                  f"{'cleared' if existed else 'nothing stored'}")
            else:
                self._print_state(limiter, identity, where)

    def _print_state(self, limiter: RateLimiter, identity: str, where: str) -> None:
        decision = limiter.peek(identity)
        self.stdout.write(f"rule       {where}")
        self.stdout.write(f"key        {limiter.key(identity)}")
        self.stdout.write(f"limit      {decision.limit} per {limiter.rate.period}s "
                          f"({limiter.algorithm.name})")
        self.stdout.write(f"remaining  {decision.remaining}")
        self.stdout.write(f"reset in   {decision.reset_after or 0.0:.1f}s")
        state = ("allowed" if decision.allowed
                 else f"BLOCKED, retry in {decision.retry_after:.1f}s")
        self.stdout.write(f"next hit   {state}")

    # --- which limits -----------------------------------------------------------------

    def _targets(self, options: dict[str, Any]) -> list[Target]:
        chosen = [name for name in ("rule", "view") if options[name] is not None]
        if len(chosen) > 1:
            raise ConfigurationError("give either --rule or --view, not both")
        if chosen and options["group"]:
            raise ConfigurationError(f"--group names a limit in full; --{chosen[0]} "
                                     "already has its group")
        if options["burst"] is not None and options["algorithm"] not in (None,
                                                                          "token_bucket"):
            raise ConfigurationError("--burst only applies to --algorithm token_bucket")
        if options["rule"] is not None:
            return self._pick(self._settings_rule(options["rule"]), options)
        if options["view"] is not None:
            return self._pick(view_rules(options["view"]), options)
        if not options["group"] or not options["rate"]:
            raise ConfigurationError("give --rule, --view, or --group with --rate")
        limiter = RateLimiter(options["rate"], algorithm=options["algorithm"] or DEFAULT_ALGORITHM,
                              burst=options["burst"], group=options["group"])
        return [(limiter, options["key"] or "ip", f"group {options['group']!r}")]

    @staticmethod
    def _settings_rule(wanted: str) -> list[tuple[Rule, str]]:
        entries = list(get_config().feature("RATELIMIT")["RULES"])
        rules = compile_rules(entries)
        for i, (entry, rule) in enumerate(zip(entries, rules, strict=True)):
            if wanted == str(i) or wanted == entry.get("name"):
                return [(rule, f"RULES[{i}]")]
        raise ConfigurationError(f"no RATELIMIT rule {wanted!r} (give an index or a name)")

    @staticmethod
    def _pick(rules: list[tuple[Rule, str]], options: dict[str, Any]) -> list[Target]:
        """The rules' limiters, narrowed by --rate/--algorithm/--burst; refuses values
        none of the rules use (they would address a key nobody writes)."""
        rate = parse_rate(options["rate"]) if options["rate"] else None
        targets, seen = [], []
        for rule, where in rules:
            seen.append(_describe(rule))
            if options["algorithm"] not in (None, rule.algorithm):
                continue
            if options["burst"] is not None and options["burst"] != rule.burst:
                continue
            if rule.rate_is_callable:
                if rate is None:
                    raise ConfigurationError(
                        f"{where} has a callable rate: give --rate (the client's tier)")
                limiter = rule.limiter_at(rate)
            else:
                assert rule.limiter is not None
                if rate is not None and rate != rule.limiter.rate:
                    continue
                limiter = rule.limiter
            if options["key"] not in (None, rule.key_spec):
                raise ConfigurationError(f"{where} counts by key {rule.key_spec!r}, not "
                                         f"{options['key']!r}")
            targets.append((limiter, rule.key_spec, where))
        if not targets:
            given = " ".join(f"--{name} {options[name]!r}" for name in ("rate", "algorithm",
                                                                       "burst")
                             if options[name] is not None)
            raise ConfigurationError(f"no rule matches {given}; the rules are: "
                                     f"{'; '.join(seen)}")
        return targets


def _describe(rule: Rule) -> str:
    rate = "callable rate" if rule.rate_is_callable else repr(str(rule.limiter.rate)
                                                              if rule.limiter else "")
    burst = f" burst {rule.burst}" if rule.burst else ""
    return f"group {rule.group!r} {rate} {rule.algorithm}{burst} key {rule.key_spec!r}"


def view_rules(path: str) -> list[tuple[Rule, str]]:
    """The @ratelimit rules of the view at ``path``, with the groups the decorator counts
    them under; ``ConfigurationError`` if it cannot be imported or is not decorated."""
    try:
        view = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(f"view {path!r} cannot be imported: {exc}") from None
    if pyinspect.isclass(view):
        found = []
        for handler_name in HANDLERS:
            handler = getattr(view, handler_name, None)
            if handler is not None:
                found += _rules_of(handler, f"{path}.{handler_name}")
    else:
        found = _rules_of(view, path)
    if not found:
        raise ConfigurationError(f"view {path!r} is not decorated with @ratelimit")
    return found


def _rules_of(handler: Any, where: str) -> list[tuple[Rule, str]]:
    rules: Iterable[Rule] = getattr(handler, RULES_ATTR, ())
    out = []
    for rule in rules:
        if rule.auto_group:
            # method_decorator decorates the bound method on each call: the group is the
            # method's dotted name, not that of the stand-in the attributes were copied from.
            group = f"{handler.__module__}.{handler.__qualname__}"
            if group != rule.group:
                rule = _regrouped(rule, group)
        out.append((rule, where))
    return out


def _regrouped(rule: Rule, group: str) -> Rule:
    regrouped = copy.copy(rule)
    regrouped.group = group
    regrouped._limiters = {}
    if rule.limiter is not None:
        regrouped.limiter = regrouped._build(rule.limiter.rate)
    return regrouped
