"""``manage.py create_demo_user``: the account the sessions demo signs in with."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME, PASSWORD = "demo", "demo-password"


class Command(BaseCommand):
    help = f"Create (or reset) the demo user {USERNAME!r} with password {PASSWORD!r}."

    def handle(self, *args: Any, **options: Any) -> None:
        user, created = get_user_model().objects.get_or_create(username=USERNAME)
        user.set_password(PASSWORD)
        user.save()
        self.stdout.write(f"{'created' if created else 'reset'} user {USERNAME!r} "
                          f"(password {PASSWORD!r}); sign in at /accounts/login/")
