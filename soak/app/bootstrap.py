"""``python -m soak.app.bootstrap``: create the SQLite schema and the soak's users."""

from __future__ import annotations

import os

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "soak.app.settings")
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from soak import config

    call_command("migrate", verbosity=0, interactive=False)
    users = get_user_model()
    for i in range(config.USERS):
        if not users.objects.filter(username=config.username(i)).exists():
            users.objects.create_user(config.username(i), password=config.PASSWORD)


if __name__ == "__main__":
    main()
