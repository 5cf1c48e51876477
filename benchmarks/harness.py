"""Side-by-side benchmark harness: ours vs the library a user would otherwise pick.

Each scenario is a pair (or more) of zero-argument callables run in the same process,
against the same Redis, interleaved in rounds so that machine noise hits every contender
alike. We report the median of per-round throughputs and the ratio of medians — never a
single timing, and never an assertion: benchmarks inform, tests decide.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Result:
    scenario: str
    contender: str
    ops_per_round: int
    rates: list[float] = field(default_factory=list)  # ops/second, one per round

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def measure(fn: Callable[[], object], ops: int) -> float:
    """Run ``fn`` ``ops`` times and return operations per second."""
    started = time.perf_counter()
    for _ in range(ops):
        fn()
    return ops / (time.perf_counter() - started)


def compare(
    scenario: str,
    contenders: dict[str, Callable[[], object]],
    *,
    ops: int = 2000,
    rounds: int = 7,
    warmup: int = 200,
) -> list[Result]:
    """Benchmark every contender in interleaved rounds; print medians and ratios.

    The first contender is ours; ratios are ``ours / theirs`` (> 1 means we are faster).
    """
    results = {name: Result(scenario, name, ops) for name in contenders}
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in contenders.items():
            results[name].rates.append(measure(fn, ops))
    report(scenario, list(results.values()))
    return list(results.values())


def report(scenario: str, results: list[Result]) -> None:
    ours = results[0]
    print(f"\n## {scenario}")
    print(f"{'contender':<40} {'median ops/s':>14} {'ratio ours/theirs':>18}")
    for result in results:
        ratio = "" if result is ours else f"{ours.median / result.median:>18.2f}"
        print(f"{result.contender:<40} {result.median:>14,.0f} {ratio}")


def alternating_medians(contenders: dict[str, Callable[[], object]],
                        n: int = 3000) -> dict[str, float]:
    """Median seconds of one call per contender, the contenders taking turns call by call.

    On a shared machine a call preempted by another process takes ten times as long; the
    median over thousands of alternating calls is the cost of a call that was not,
    measured under the same conditions for every contender.
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(n):
        for name, fn in contenders.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(samples) for name, samples in times.items()}
