"""The optional parts of the install, and the one-line error when a command needs one that is
missing.

The default install answers in the terminal and from Python; the browser chat, the map, the HTTP API
and MCP each come as an extra of `pyproject.toml` (together: `all`), because they pull most of the
weight (gradio with pandas; scipy and scikit-learn for the map). `EXTRAS` names, per extra, the
modules that prove it installed; `tests/test_extras.py` checks it against `pyproject.toml`.
"""

from __future__ import annotations

import importlib

from rag.errors import RagError

# extra -> (what it serves, the modules it installs that the product imports)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ui": ("the browser chat (rag ui)", ("gradio", "openTSNE", "sklearn")),
    "map": ("the papers' map (rag map)", ("openTSNE", "sklearn")),
    "serve": ("the HTTP API (rag serve)", ("starlette", "uvicorn", "mcp")),
    "mcp": ("the MCP server (rag mcp)", ("mcp", "anyio")),
}


def install_hint(extra: str) -> str:
    """The command that installs `extra`, for an installed package and for a checkout."""
    return f"pip install 'rag-papers[{extra}]' (in a checkout: pip install -e '.[{extra}]')"


def require(extra: str) -> None:
    """Raise a `RagError` naming the extra to install when any module of `extra` cannot be imported.
    Imports them (the caller is about to), so a broken install fails here with the same message."""
    serves, modules = EXTRAS[extra]
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise RagError(
            f"{serves} needs {', '.join(missing)}, which the default install leaves out: "
            f"{install_hint(extra)}"
        )
