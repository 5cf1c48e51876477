"""Look up or delete one idempotency record, given whom it belongs to and the raw key.

    manage.py idempotency show   --user 42 order-7f3a        # or --user alice
    manage.py idempotency show   --session <session key> order-7f3a --body
    manage.py idempotency delete --scope tenant:acme order-7f3a

Records are named by ``HMAC(scope, key)``, so the raw key cannot be listed back from Redis;
``count`` gives the number of records (SCAN, never KEYS).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...conf import get_config
from ...exceptions import InvalidIdempotencyKey
from ...idempotency import IdempotencyStore, parse_key
from ..base import RedisCommand, find_user


class Command(RedisCommand):
    help = "Show, delete or count idempotency records (see docs/idempotency.md)."
    feature = "IDEMPOTENCY"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        for name, text in (("show", "print the record for a key"),
                           ("delete", "delete the record so the next request runs anew")):
            p = sub.add_parser(name, help=text)
            who = p.add_mutually_exclusive_group(required=True)
            who.add_argument("--user", help="the user (scope user:<pk>): a primary key when "
                             "all digits and such a user exists, else a username")
            who.add_argument("--session", help="the session key (scope session:<key>)")
            who.add_argument("--scope", help="a scope string as your SCOPE callable returns it")
            p.add_argument("key", help="the raw Idempotency-Key value")
            if name == "show":
                p.add_argument("--body", action="store_true", help="also print the body")
        sub.add_parser("count", help="count the records under this app's prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        store = IdempotencyStore(get_config().connection_for("IDEMPOTENCY"))
        if options["action"] == "count":
            self.stdout.write(str(sum(1 for _ in store.scan())))
            return
        scope = _scope(options)
        try:
            key = parse_key(options["key"])
        except InvalidIdempotencyKey as exc:
            raise CommandError(f"invalid key: {exc}") from exc
        if options["action"] == "delete":
            deleted = store.delete(scope, key)
            self.stdout.write("deleted" if deleted else "no such record")
            return
        record = store.lookup(scope, key)
        if record is None:
            raise CommandError(f"no record for that key in scope {scope!r}")
        out: dict[str, Any] = {"key_hash": record.key_hash, "redis_key": record.redis_key,
                               "state": record.state, "ttl_seconds": record.ttl_ms / 1000,
                               **record.extra}
        if record.fingerprint is not None:
            out["method"] = record.fingerprint.method
        if record.response is not None:
            out["status"] = record.response.status
            out["headers"] = dict(record.response.headers)
            out["body_bytes"] = len(record.response.body)
            if options.get("body"):
                out["body"] = record.response.body.decode("utf-8", "backslashreplace")
        self.stdout.write(json.dumps(out, indent=2))


def _scope(options: dict[str, Any]) -> str:
    if options.get("user"):
        return f"user:{find_user(options['user']).pk}"
    if options.get("session"):
        return f"session:{options['session']}"
    return str(options["scope"])
