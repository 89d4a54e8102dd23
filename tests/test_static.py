"""The package's static files (the map page's and the chat's HTML, CSS and JavaScript): each
JavaScript file parses (`node --check`, where node is on PATH), and every static directory ships in
the wheel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
# Package name -> folder: rag/, and the folders pyproject maps into it (ui/ installs as rag/ui/).
ROOTS = {
    "rag": REPO / "rag",
    **{name: REPO / folder for name, folder in SETUPTOOLS["package-dir"].items()},
}
STATIC_DIRS = sorted({p for root in ROOTS.values() for p in root.rglob("static") if p.is_dir()})
SCRIPTS = sorted(p for d in STATIC_DIRS for p in d.glob("*.js"))
NODE = shutil.which("node")


def test_the_static_files_are_where_the_code_reads_them():
    names = {p.relative_to(REPO).as_posix() for d in STATIC_DIRS for p in d.iterdir()}
    assert {
        "rag/paper_map/static/map.html",
        "rag/paper_map/static/map.css",
        "rag/paper_map/static/map.js",
        "ui/static/app.css",
        "ui/static/map_bridge.js",
    } <= names, names


@pytest.mark.skipif(NODE is None, reason="node is not on PATH (apt-get install -y nodejs)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_script_parses(script):
    proc = subprocess.run(
        [NODE, "--check", str(script)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(NODE is None, reason="node is not on PATH (apt-get install -y nodejs)")
def test_a_syntax_error_fails_the_check(tmp_path):
    broken = tmp_path / "broken.js"
    broken.write_text(
        SCRIPTS[0].read_text(encoding="utf-8").replace("function", "function (", 1),
        encoding="utf-8",
    )
    proc = subprocess.run(
        [NODE, "--check", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "SyntaxError" in proc.stderr


def test_every_static_directory_ships_in_the_wheel():
    """Each static/ folder is a package of pyproject's (setuptools asks that of data folders) whose
    package-data patterns cover every file in it."""
    from fnmatch import fnmatch

    for directory in STATIC_DIRS:
        # the deepest root holding it: ui/static is rag.ui.static
        name, root = max(
            ((n, r) for n, r in ROOTS.items() if directory.is_relative_to(r)),
            key=lambda item: len(item[1].parts),
        )
        package = ".".join([name, *directory.relative_to(root).parts])
        assert package in SETUPTOOLS["packages"], f"pyproject.toml: {package} is not in packages"
        patterns = SETUPTOOLS["package-data"].get(package, [])
        left_out = [
            f.name for f in directory.iterdir() if not any(fnmatch(f.name, p) for p in patterns)
        ]
        assert not left_out, f"pyproject.toml: package-data of {package} leaves out {left_out}"
