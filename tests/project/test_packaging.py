"""The sdist and the wheel hold what an installed weft_django needs: migrations, templates, static
files, py.typed and the LICENSE (issue 20).

Builds both with ``python -m build`` (the wheel from the sdist, as PyPI users get it) from a copy of
the tracked files, so the work tree gets no build/ or egg-info directories.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "weft_django"

pytestmark = [pytest.mark.sqlite, pytest.mark.timeout(600)]


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.fail("tests/project/test_packaging.py needs git (it builds from the tracked files)")
    return [name for name in out.decode().split("\0") if name]


def _expected() -> set[str]:
    """Paths (relative to the project root) that every distribution must hold."""
    wanted = {"weft_django/py.typed", "weft_django/__init__.py", "weft_django/tasks/__init__.py"}
    for folder in ("migrations", "templates", "static"):
        for path in (PACKAGE / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                wanted.add(path.relative_to(ROOT).as_posix())
    return wanted


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    source = tmp_path_factory.mktemp("source")
    for name in _tracked_files():
        if name.startswith(("benchmarks/", "tests/", "docs/images/")):
            continue
        target = source / name
        if not (ROOT / name).is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    outdir = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(source)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, f"python -m build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    sdists = list(outdir.glob("weft_django-*.tar.gz"))
    wheels = list(outdir.glob("weft_django-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in outdir.iterdir())
    return {"sdist": sdists[0], "wheel": wheels[0]}


def test_expected_files_exist_in_the_tree() -> None:
    expected = _expected()
    assert any(p.startswith("weft_django/migrations/0001") for p in expected)
    assert any(p.startswith("weft_django/templates/") and p.endswith(".html") for p in expected)
    assert any(p.startswith("weft_django/static/") and p.endswith(".css") for p in expected)


def test_wheel_holds_package_data_and_license(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        missing = _expected() - names
        assert not missing, f"missing from the wheel: {sorted(missing)}"
        assert not [n for n in names if n.startswith("tests/")], "the wheel must not ship the tests"
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(info).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
        entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "weft_django = weft_django.testing" in entry_points
    assert "License-Expression: MIT" in metadata
    for classifier in (
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.0",
        "Framework :: Django :: 6.1",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ):
        assert f"Classifier: {classifier}" in metadata
    assert "Project-URL: Source," in metadata
    assert "Project-URL: Documentation," in metadata


def test_sdist_holds_package_data_and_license(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    missing = (_expected() | {"LICENSE", "README.md", "pyproject.toml"}) - names
    assert not missing, f"missing from the sdist: {sorted(missing)}"
