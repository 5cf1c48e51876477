import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "soak.app.settings")
os.environ.setdefault("SOAK_ASYNC_VIEWS", "1")
application = get_asgi_application()
