"""The soak's Django project: the public API used as the docs show it (``SOAK_STACK=ours``),
or the stack it replaces (``SOAK_STACK=theirs``: django-redis cache, Django's cache session
engine, django-ratelimit, no idempotency layer) for the end-to-end benchmark."""
