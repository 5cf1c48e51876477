from __future__ import annotations

from django.apps import AppConfig


class SoakAppConfig(AppConfig):
    name = "soak.app"
    label = "soak_app"

    def ready(self) -> None:
        # Every sign-in would write last_login to SQLite from 16 threads at once; the soak
        # measures Redis, not SQLite's write lock.
        from django.contrib.auth.models import update_last_login
        from django.contrib.auth.signals import user_logged_in

        user_logged_in.disconnect(update_last_login, dispatch_uid="update_last_login")

        from soak.app.views import start_stall_watch

        start_stall_watch()
