"""The package's import rules (issues 29 and 47), read from the source with `ast`: the layers of
the pipeline import downwards only, no two modules import each other (directly or round a loop, lazy
imports inside functions included), surfaces stay independent of one another and reach the pipeline
through the engine only, and one module each holds the chromadb and llama_index imports. An
equivalent of import-linter's layers/independence/forbidden contracts, kept as a test so it runs
wherever the suite does (the fast tier included).

The package's folders are read as the wheel installs them: rag/, and each folder pyproject.toml's
[tool.setuptools.package-dir] maps into it (ui/ is `rag.ui`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
_SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
# Import name -> folder: rag/ itself, and the folders mapped into it (those holding Python code).
ROOTS = {
    "rag": REPO / "rag",
    **{name: REPO / folder for name, folder in _SETUPTOOLS["package-dir"].items()},
}

# Lowest first. A module may import from its own layer and the layers below it, never from above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves",
        (
            "rag.errors",
            "rag.config",
            "rag.models",
            "rag.prompts",
            "rag.text",
            "rag.latex",
            "rag.extras",
            "rag.net",
            "rag.markers",
        ),
    ),
    ("backends", ("rag.backends",)),
    ("write path", ("rag.index", "rag.metadata", "rag.cite")),
    ("retrieval", ("rag.retrieve",)),
    ("answering and the map", ("rag.answer", "rag.paper_map")),
    (
        "engine",
        (
            "rag.engine",
            "rag.llamaindex",
            "rag.testing",
            "rag.doctor",
            "rag.evaluation",
            "rag.config_docs",
            "rag",
        ),
    ),
    ("surfaces", ("rag.cli", "rag.__main__", "rag.serve", "rag.ui")),
]
# Surfaces that must not import each other (the CLI starts them all, so it is not one of these).
INDEPENDENT = ("rag.serve", "rag.ui")
SURFACES = ("rag.cli", "rag.__main__", "rag.serve", "rag.ui")
# What a surface may import besides surfaces (INDEPENDENT rules their imports of each other):
# - the engine's face: the `rag` package (its __all__: RAG, the result and error types, the
#   cancellation and agent-text helpers; not every module under it) and rag.engine;
# - the shared vocabulary: leaf modules of constants, argument checks and formatting that hold no
#   pipeline state (rag.cite and rag.metadata format a Paper; rag.markers the [n] markers).
# Anything else a surface needs is a method of RAG or a name of `rag`: the answer, retrieval, index,
# backend and map modules can change behind the engine.
ENGINE_FACE = ("rag", "rag.engine")
VOCABULARY = (
    "rag.errors",
    "rag.config",
    "rag.models",
    "rag.text",
    "rag.latex",
    "rag.prompts",
    "rag.extras",
    "rag.net",
    "rag.markers",
    "rag.cite",
    "rag.metadata",
)
# The CLI also fronts the engine layer's two command modules: `rag doctor` and `rag eval`.
CLI_ONLY = ("rag.doctor", "rag.evaluation")
# Third-party packages only one module may import: the rest of rag goes through it.
ONE_IMPORTER = {"chromadb": "rag.index.vectors", "llama_index": "rag.llamaindex"}


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = [*package.split("."), *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(package, root, p): p
    for package, root in ROOTS.items()
    for p in sorted(root.rglob("*.py"))
}


def _imports(name: str) -> tuple[set[str], set[str]]:
    """The rag modules and the top-level third-party packages module `name` imports, anywhere in
    it."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    ours, theirs = set(), set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            # `from rag import prompts` imports the module rag.prompts; `from rag.x import f`
            # imports rag.x
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in targets:
            if target.split(".")[0] != "rag":
                theirs.add(target.split(".")[0])
                continue
            while target not in MODULES:
                target = target.rpartition(".")[0]
            if target != name:
                ours.add(target)
    return ours, theirs


GRAPH = {name: _imports(name)[0] for name in MODULES}


def _layer(name: str) -> int:
    """The layer of a module: the one naming the longest prefix of it."""
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) < 0] == []


def test_layers_import_downwards_only():
    upward = [
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, targets in GRAPH.items()
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert upward == []


def test_the_ui_folder_is_read_as_rag_ui():
    assert {"rag.ui", "rag.ui.app", "rag.ui.render"} <= set(MODULES)
    assert MODULES["rag.ui.app"] == REPO / "ui" / "app.py"


def test_rag_ui_is_imported_from_the_ui_folder():
    """In a checkout, `rag.ui` is ui/ (the editable install maps it): a rag/ui/ folder left behind
    by the move (its __pycache__) would shadow it as an empty namespace package."""
    import importlib.util

    import rag

    if Path(rag.__file__).parent != ROOTS["rag"]:
        pytest.skip("rag is imported from an installed copy, not this checkout")
    spec = importlib.util.find_spec("rag.ui")
    assert spec is not None and spec.origin == str(REPO / "ui" / "__init__.py"), (
        "rag.ui resolves to"
        f" {spec and (spec.origin or list(spec.submodule_search_locations or []))}: delete the"
        " leftover rag/ui/ folder, and `pip install -e .` if ui/ is not mapped"
    )


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _past_the_engine(graph: dict[str, set[str]]) -> list[str]:
    """The imports by which a surface reaches past the engine: of any rag module but a surface, the
    engine's face and the shared vocabulary (and, for the CLI, CLI_ONLY)."""
    found = []
    for a, targets in graph.items():
        if not _within(a, SURFACES):
            continue
        allowed = VOCABULARY + (CLI_ONLY if _within(a, ("rag.cli", "rag.__main__")) else ())
        found += [
            f"{a} imports {b}"
            for b in sorted(targets)
            if not (b in ENGINE_FACE or _within(b, SURFACES) or _within(b, allowed))
        ]
    return found


def test_surfaces_go_through_the_engine():
    assert _past_the_engine(GRAPH) == []


def test_the_engine_check_finds_a_surface_reaching_past_it():
    """The check itself can fail: a UI module importing the answer layer is found, and the CLI's own
    allowances are the CLI's only."""
    graph = {
        "rag.ui.app": {"rag", "rag.ui.render", "rag.answer.injection"},
        "rag.serve.http": {"rag.doctor", "rag.net"},
        "rag.cli": {"rag.doctor", "rag.ui.app", "rag.index.repair"},
        "rag.engine": {"rag.index.store"},
    }
    assert _past_the_engine(graph) == [
        "rag.ui.app imports rag.answer.injection",
        "rag.serve.http imports rag.doctor",
        "rag.cli imports rag.index.repair",
    ]


def test_surfaces_are_independent():
    crossing = [
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        for b in targets
        for x in INDEPENDENT
        for y in INDEPENDENT
        if x != y and (a == x or a.startswith(x + ".")) and (b == y or b.startswith(y + "."))
    ]
    assert crossing == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle():
    """The check itself can fail: a loop of three is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


@pytest.mark.parametrize("package", sorted(ONE_IMPORTER))
def test_one_module_imports_each_storage_and_framework_package(package):
    importers = sorted(name for name in MODULES if package in _imports(name)[1])
    assert importers == [ONE_IMPORTER[package]]
