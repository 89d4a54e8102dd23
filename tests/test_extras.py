"""The install's optional parts: what the code imports is declared in `pyproject.toml` (the core for
what the default path imports, an extra for a surface), and a command whose extra is missing ends in
one line naming the `pip install` that adds it.

A missing extra is simulated by `sys.modules[name] = None` (Python's own way to make an import
fail), in a subprocess running the real CLI: the test environment has every extra installed.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib

from rag.errors import RagError
from rag.extras import EXTRAS, require

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# Installed by a script, not by pip extras: llama.cpp must be built with safe CPU flags
# (scripts/install_local_llm.sh); gguf reads the nomic model the script cuts out of four wheels.
SCRIPT_INSTALLED = {"llama_cpp": "scripts/install_local_llm.sh", "gguf": "scripts/install_nomic.sh"}
# Modules that belong to a surface: their module-level imports may come from that surface's extra.
# rag/serve/requests.py is shared by the serve and mcp surfaces: core imports only.
SURFACE_OF = {
    "ui/app.py": "ui",
    "ui/map_view.py": "ui",
    "ui/security.py": "ui",
    "rag/serve/http.py": "serve",
    "rag/serve/gate.py": "serve",
    "rag/serve/openai_shapes.py": "serve",
    "rag/serve/mcp.py": "mcp",
}


def _name(requirement: str) -> str:
    for stop in "<>=!~[ ;":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower().replace("_", "-")


def _extra(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions an extra installs, its `rag-papers[...]` references followed."""
    out: set[str] = set()
    for req in PYPROJECT["optional-dependencies"][name]:
        if _name(req) == "rag-papers":
            for inner in req.split("[", 1)[1].split("]", 1)[0].split(","):
                if inner not in seen:
                    out |= _extra(inner.strip(), seen | {name})
        else:
            out.add(_name(req))
    return out


CORE = {_name(r) for r in PYPROJECT["dependencies"]}
EVERY_EXTRA = set().union(*(_extra(e) for e in PYPROJECT["optional-dependencies"]))


@functools.cache
def _providers() -> dict[str, list[str]]:
    """Which installed distributions provide each top-level module: one scan of every installed
    package's file list (about a second), not one per import checked."""
    return dict(packages_distributions())


def _distributions(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in _providers().get(module, [])}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level) for every absolute import of a third-party
    module."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    type_checking = {
        id(n)
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    # `try: import x` / `except ImportError:` is an optional import with a fallback: no declaration
    # needed.
    optional = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(
            "ImportError" in ast.unparse(h.type or ast.Name("BaseException")) for h in node.handlers
        )
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if (
                top in sys.stdlib_module_names
                or top == "rag"
                or id(node) in type_checking | optional
            ):
                continue
            found.append((top, id(node) in top_level))
    return found


# rag/ and ui/ (installed as rag/ui/, see pyproject's [tool.setuptools.package-dir]).
SOURCES = sorted(
    p.relative_to(REPO).as_posix()
    for folder in ("rag", "ui")
    for p in (REPO / folder).rglob("*.py")
)


@pytest.mark.parametrize("source", SOURCES)
def test_every_import_is_declared(source):
    """Module-level imports come from the core (or the file's surface extra); imports inside
    functions from the core or any extra; nothing comes from an undeclared package."""
    for module, at_top in _imports(REPO / source):
        if module in SCRIPT_INSTALLED:
            continue
        # Not installed here (torch without the [fast] extra): a distribution of the module's own
        # name.
        dists = _distributions(module) or {module.lower().replace("_", "-")} & EVERY_EXTRA
        assert dists, (
            f"{source} imports {module}, which no installed or declared distribution provides"
        )
        allowed = CORE | _extra(SURFACE_OF[source]) if source in SURFACE_OF else CORE
        if not at_top:
            allowed = CORE | EVERY_EXTRA
        assert dists & allowed, (
            f"{source} imports {module} ({', '.join(sorted(dists))}) "
            f"{'at module level' if at_top else ''}, not declared where it is needed"
        )


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_modules_each_extra_promises_come_with_it(extra):
    installs = _extra(extra)
    for module in EXTRAS[extra][1]:
        assert _distributions(module) & installs, f"[{extra}] does not install {module}"


def test_the_default_install_leaves_the_heavy_surfaces_out():
    for heavy in ("gradio", "scikit-learn", "opentsne", "mcp", "starlette"):
        assert heavy not in CORE
        assert heavy in EVERY_EXTRA


@pytest.mark.parametrize(
    ("command", "blocked", "extra"),
    [
        (["ui"], "gradio", "ui"),
        (["map", "--out", "m.html"], "sklearn", "map"),
        (["serve"], "starlette", "serve"),
        (["mcp"], "mcp", "mcp"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(command, blocked, extra, tmp_path):
    script = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from rag.cli import main\n"
        f"sys.exit(main({command + ['--store', str(tmp_path / 'store')]!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("rag: error: ") and f"pip install 'rag-papers[{extra}]'" in lines[0]
    assert blocked in lines[0]
    assert not (tmp_path / "store").exists(), (
        "the command built an index before finding the extra missing"
    )


def test_the_python_map_without_its_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "openTSNE", None)
    with pytest.raises(RagError, match=r"rag-papers\[map\]"):
        require("map")
