"""Runs in a :class:`tests.fleet.Peer`'s venv: one request (JSON on stdin) -> one JSON line.

The request holds Django settings (``CACHES``, ``REDIS_PATTERNS``, ...), a Python snippet and
its globals; the snippet sees ``cache`` (``caches["default"]``) and sets ``result``. Bytes
in the result are returned as ``{"bytes": hex}``; an exception as ``{"error": "Type: msg"}``.
"""

import json
import sys
import traceback


def jsonable(value):
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def main():
    request = json.load(sys.stdin)
    import django
    from django.conf import settings

    settings.configure(**{"USE_TZ": True, "SECRET_KEY": "fleet", **request["settings"]})
    django.setup()
    from django.core.cache import caches

    names = {"__name__": "fleet_snippet", **request["names"]}
    if "CACHES" in request["settings"]:
        names["cache"] = caches["default"]
    try:
        exec(request["code"], names)
        out = jsonable(names.get("result"))
    except Exception as exc:  # the test decides what an exception means
        out = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
