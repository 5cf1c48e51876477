"""Print the least-privilege ``ACL SETUSER`` line for the current settings.

    manage.py redis_acl                 # user "app", the features this project uses
    manage.py redis_acl --user web      # another user name
    manage.py redis_acl --all           # as if every feature (and near cache) were used
    manage.py redis_acl --cache-extras  # caches also used through django-redis's sadd, hset...

One line per Redis server the settings name, granting exactly the commands, key patterns
and channels the caches and features on it need (docs/security.md, "Least privilege").
The password is a placeholder: this command never reads or prints a real one. Nothing is
sent to Redis.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...checks.rights import acl_setuser
from ...checks.targets import collect_targets, rights_needed
from ..base import RedisCommand

_USER = re.compile(r"[A-Za-z0-9_.@-]+")


class Command(RedisCommand):
    help = "Print the ACL SETUSER line granting what the configured features need."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", default="app", help="the ACL user name (default: app)")
        parser.add_argument("--all", action="store_true",
                            help="include every feature (and a near cache on every cache), "
                            "not only those the project uses")
        parser.add_argument("--cache-extras", action="store_true",
                            help="also django-redis's set, hash and sorted-set API on caches")

    def handle(self, *args: Any, **options: Any) -> None:
        user = options["user"]
        if not _USER.fullmatch(user):
            raise CommandError(f"--user {user!r}: use letters, digits and _ . @ - only")
        _import_urlconf()  # features used only by views count as used, as in the checks
        printed = 0
        for target in collect_targets(everything=options["all"]):
            wanted = rights_needed(target, near=options["all"],
                                   extras=options["cache_extras"])
            if not wanted:
                continue
            self.stdout.write(f"# Redis at {target.endpoint}: "
                              f"{', '.join(need.feature for need in wanted)}")
            self.stdout.write(acl_setuser(user, wanted))
            printed += 1
        if not printed:
            raise CommandError("No Redis cache or feature is configured: nothing to grant.")


def _import_urlconf() -> None:
    from django.urls import get_resolver

    # A broken URLconf is reported by Django's own checks.
    with contextlib.suppress(Exception):
        get_resolver().url_patterns  # noqa: B018  (imports the views)
