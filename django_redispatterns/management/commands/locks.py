"""List held locks, or force-release one: ``manage.py locks list`` / ``locks release NAME``.

Walks the keyspace with SCAN (never KEYS), on the locks connection (every quorum member in
quorum mode). Force-release deletes the lock key only: the fencing counter stays, so the
next holder still gets a higher fencing token than the one that was cut off.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_redispatterns import connection, keys
from django_redispatterns.conf import get_config
from django_redispatterns.locks import DEFAULT_NAMESPACE, held_key
from django_redispatterns.locks._names import connection_names

from ..base import RedisCommand, describe, printable


def _connections() -> list[str]:
    return connection_names(get_config().feature("LOCKS")["QUORUM"])


class Command(RedisCommand):
    help = "List held locks (owner, TTL, fencing token) or force-release one."
    feature = "LOCKS"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="show every held lock")
        listing.add_argument("--namespace", default=None, help="only this namespace")
        release = sub.add_parser("release", help="delete a held lock (needs --force)")
        release.add_argument("name")
        release.add_argument("--namespace", default=DEFAULT_NAMESPACE)
        release.add_argument("--force", action="store_true",
                             help="really delete it, whoever holds it")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            self.list_locks(options["namespace"])
        else:
            self.release(options["name"], options["namespace"], options["force"])

    def list_locks(self, namespace: str | None) -> None:
        tag = "{" + namespace + "}" if namespace else "*"
        pattern = f"{keys.glob_escape(keys.prefix())}:lock:{tag}:held:*"
        rows = []
        conns = _connections()
        for conn in conns:
            client = connection.client_for(self.using(conn))
            found = list(client.scan_iter(match=pattern, count=1000))
            if not found:
                continue
            pipe = client.pipeline(transaction=False)
            for key in found:
                pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute()
            for key, value, pttl in zip(found, replies[::2], replies[1::2], strict=True):
                if value is not None and value != b"~":  # "~": being handed to a waiter
                    rows.append(self._row(conn, key, value, pttl))
        if not rows:
            self.stdout.write("no locks held")
            return
        many = len(conns) > 1
        self.stdout.write("name\towner\tttl_s\tfencing_token\ttoken" +
                          ("\tconnection" if many else ""))
        for row in sorted(rows):
            self.stdout.write("\t".join(printable(cell, keep="") for cell in (
                row if many else row[:-1])))

    @staticmethod
    def _row(conn: str, key: bytes, value: bytes, pttl: int) -> tuple[str, ...]:
        token, _, rest = value.decode("utf-8", "replace").partition("|")
        fence, _, meta_text = rest.partition("|")
        try:
            meta = json.loads(meta_text)
        except ValueError:
            meta = {}
        name = str(meta.get("name") or key.decode("utf-8", "replace").rsplit(":", 1)[-1])
        owner = f"{meta.get('host', '?')}:{meta.get('pid', '?')}"
        if meta.get("by"):
            owner += f" ({meta['by']})"
        ttl = f"{pttl / 1000:.1f}" if pttl >= 0 else "none"
        return (name, owner, ttl, fence, token, describe(conn))

    def release(self, name: str, namespace: str, force: bool) -> None:
        key = held_key(name, namespace)
        if not force:
            raise CommandError(
                f"refusing to release {name!r} without --force: its holder may still be "
                "working, and its fencing token stays valid in stores that check it"
            )
        deleted = 0
        for conn in _connections():
            deleted += int(connection.client_for(self.using(conn)).delete(key))
        if not deleted:
            raise CommandError(f"lock {name!r} (namespace {namespace!r}) is not held")
        self.stdout.write(f"released {name!r}; its holder will see LockLost at its next "
                          "heartbeat")
