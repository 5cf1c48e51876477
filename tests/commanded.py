"""A spawned process that runs commands for a test: the other side of a cross-process test.

``target(*args, cmds, out)`` (an importable function) sets itself up, puts ``"ready"`` on
``out``, then answers each ``(command, *args)`` it gets on ``cmds`` on ``out``, until
``"stop"``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


class Commanded:
    """``call(cmd, *args)`` runs a command in the process and returns its answer."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.cmds, self.out = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=target, args=(*args, self.cmds, self.out), daemon=True)
        self.proc.start()
        assert self.out.get(timeout=120) == "ready"

    def call(self, cmd: str, *args: Any, timeout: float = 60) -> Any:
        self.cmds.put((cmd, *args))
        return self.out.get(timeout=timeout)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("stop", timeout=15)
            except Exception:
                self.proc.terminate()
        self.proc.join(15)
