"""The fault matrix: every public entry point against every fault, each cell bounded.

Rows are the entry points registered in tests/matrix_http.py and tests/matrix_calls.py,
columns the faults of tests/matrix_faults.py (connection refused, a server hung past the
socket timeout, out of memory on writes, a read-only replica, a flushed script cache).
Each cell asserts the outcome docs/failure-modes.md states for it, within a bound: never
an unhandled 500, a traceback, a hang or a silently wrong answer. The test ids
(``ratelimit_middleware-hung``) are the ones the page names;
:func:`test_the_failure_modes_page_lists_every_cell_and_only_those` fails when the two drift.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import matrix_calls, matrix_http  # noqa: F401 - they register the entry points
from tests.matrix_faults import ENTRIES, FAULTS, Cell, Servers
from tests.redis_servers import own_keys_without_ttl

pytestmark = [pytest.mark.topology, pytest.mark.django_db]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "failure-modes.md"

# Known defects being fixed elsewhere: the cell runs, and fails, until the fix lands.
KNOWN: dict[tuple[str, str], str] = {}


def cells() -> list[object]:
    return list(_cells())


def _cells() -> Iterator[object]:
    for name in ENTRIES:
        for fault in FAULTS:
            marks = []
            if (name, fault) in KNOWN:
                marks.append(pytest.mark.xfail(reason=KNOWN[name, fault], strict=False))
            yield pytest.param(name, fault, id=f"{name}-{fault}", marks=marks)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    try:
        started = Servers()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield started
    try:
        for fault, server in started.by_fault.items():  # house rule: every key has a TTL
            eternal = own_keys_without_ttl(server.client())
            assert not eternal, f"{fault}: keys written without a TTL: {eternal[:10]}"
    finally:
        started.stop()


@pytest.mark.parametrize(("name", "fault"), cells())
def test_cell(servers: Servers, name: str, fault: str) -> None:
    _feature, run = ENTRIES[name]
    run(Cell(fault, servers))


# The page's table (its "### " heading) for each feature's entry points.
TABLES = {"ratelimit": "Rate limits", "idempotency": "Idempotency", "sessions": "Sessions",
          "cache": "Cache", "cache_strict": "Cache without `IGNORE_EXCEPTIONS`",
          "locks": "Locks", "commands": "Operator commands and deploy checks"}
# A cell ends with its test id in small code text: <small>`ratelimit_middleware-hung`</small>
CELL_ID = re.compile(r"<small>`([a-z_]+-[a-z_]+)`</small>")


def test_the_failure_modes_page_lists_every_cell_and_only_those() -> None:
    """docs/failure-modes.md names each cell's test id once; no cell lacks one, no id
    names a cell that does not exist."""
    named: list[str] = []
    misplaced = []
    for section in re.split(r"^### ", PAGE.read_text(), flags=re.MULTILINE)[1:]:
        heading, cells_here = section.split("\n", 1)[0].strip(), CELL_ID.findall(section)
        named += cells_here
        misplaced += [cell for cell in cells_here if cell.rsplit("-", 1)[0] in ENTRIES
                      and TABLES[ENTRIES[cell.rsplit("-", 1)[0]][0]] != heading]
    expected = {f"{name}-{fault}" for name in ENTRIES for fault in FAULTS}
    missing = sorted(expected - set(named))
    unknown = sorted(set(named) - expected)
    twice = sorted({cell for cell in named if named.count(cell) > 1})
    assert (missing, unknown, twice, misplaced) == ([], [], [], []), (
        f"cells the page does not state: {missing}; cells it states but no test runs: "
        f"{unknown}; cells it states twice: {twice}; in another feature's table: "
        f"{misplaced}")
