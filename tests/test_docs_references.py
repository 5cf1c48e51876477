"""Every test a docs page names exists, so the claims in docs/ keep pointing at real evidence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"`(?:tests/)?(test_\w+\.py)::(test_\w+)(?:\[[^\]`]*\])?`")


def references() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for module, name in REFERENCE.findall(page.read_text()):
            found.append((page.name, module, name))
    return found


def test_the_docs_name_tests() -> None:
    assert any(page == "security.md" for page, _, _ in references())


@pytest.mark.parametrize(("page", "module", "name"), references())
def test_a_named_test_exists(page: str, module: str, name: str) -> None:
    path = ROOT / "tests" / module
    assert path.exists(), f"docs/{page} names {module}, which does not exist"
    source = path.read_text()
    assert re.search(rf"^\s*(async )?def {name}\(", source, re.M), (
        f"docs/{page} names {module}::{name}, which does not exist"
    )
