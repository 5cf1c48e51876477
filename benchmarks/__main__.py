"""Run every benchmark scenario: ``./dev bench [name ...]``.

Scenarios are modules ``benchmarks/bench_<name>.py`` with a ``run()`` function. They need a
Redis: ``REDIS_URL`` if set, else a private redis-server started for the run.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent
    sys.path.insert(0, str(root.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    names = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(root)])
                   if m.name.startswith("bench_"))
    wanted = argv or names
    for name in wanted:
        if name not in names:
            print(f"unknown scenario {name!r}; known: {', '.join(names)}", file=sys.stderr)
            return 2
        importlib.import_module(f"benchmarks.bench_{name}").run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
