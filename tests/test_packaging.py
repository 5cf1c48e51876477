"""The wheel ships the top-level lua/ folder inside the package, and loads it from there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_every_lua_script(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("django_redispatterns-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"django_redispatterns/lua/{p.name}" for p in (ROOT / "lua").glob("*.lua")}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert "django_redispatterns/py.typed" in names
    templates = {f"django_redispatterns/templates/redispatterns/{name}.html"
                 for name in ("devices", "devices_base", "devices_device", "devices_unavailable")}
    assert templates <= names, f"missing from the wheel: {sorted(templates - names)}"
    assert "django_redispatterns/templates/redispatterns/sessions_unavailable.html" in names


@pytest.mark.slow
def test_installed_wheel_loads_scripts_from_the_package(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("django_redispatterns-*.whl")
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from django_redispatterns import scripts;"
        "root = scripts.lua_root(); print(root)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)], cwd=tmp_path, check=True,
        capture_output=True, text=True,
    ).stdout.strip()
    assert out.startswith(str(target)), out
