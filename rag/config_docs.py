"""`.env.example` and `docs/configuration.md`, written from `Settings` so they cannot drift from it,
and the table of rules in `docs/answers.md`, from the table of rules (rag/answer/rules/__init__.py).

    python -m rag.config_docs            # rewrite the files in the checkout
    python -m rag.config_docs --check    # exit 1 naming the stale file (tests/test_config_docs.py)

Each setting's text is its field's `description`; its variable is `RAG_<FIELD>` or the aliases it
accepts; its default is the field's (a computed default is described instead of printed, since it
depends on the machine).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from pydantic import AliasChoices
from pydantic.fields import FieldInfo

from rag.config import Settings

REPO = Path(__file__).resolve().parent.parent

# Sections, each starting at its first field (fields keep Settings' order).
SECTIONS = {
    "store_dir": "Index",
    "top_k": "Retrieval",
    "llm": "LLM",
    "ui_host": "Serving",
}

_COMPUTED = {
    "store_dir": "the checkout's store/, else ~/.local/share/rag-papers/store",
    "corpus_dir": "the seed corpus inside the package",
}


def variables(name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field reads, the one to write first."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        names = [str(c) for c in alias.choices]
        # OPENAI_BASE_URL is what people already have set; RAG_OPENAI_BASE_URL is the spare.
        return sorted(
            names,
            key=lambda n: n.startswith("RAG_") and any(not m.startswith("RAG_") for m in names),
        )
    return [f"RAG_{name.upper()}"]


def default_text(name: str, field: FieldInfo) -> str:
    if name in _COMPUTED:
        return _COMPUTED[name]
    value = field.get_default(call_default_factory=False)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _fields() -> list[tuple[str, FieldInfo]]:
    return list(Settings.model_fields.items())


def env_example() -> str:
    """The text of `.env.example`: every setting commented out at its default, under its
    description."""
    lines = [
        "# Copy to .env (in the directory you run `rag` from) and uncomment what you change.",
        "# Precedence: CLI flag > environment variable > .env > default.",
        "# Written by `python -m rag.config_docs` from rag/config.py; edit the descriptions there.",
    ]
    for name, field in _fields():
        if name in SECTIONS:
            title = f"# --- {SECTIONS[name]} "
            lines += ["", title + "-" * (100 - len(title))]
        text = (field.description or "").strip()
        lines += textwrap.wrap(text, 98, initial_indent="# ", subsequent_indent="# ")
        names = variables(name, field)
        lines.append(f"# {names[0]}={'' if name in _COMPUTED else default_text(name, field)}")
    return "\n".join(lines) + "\n"


def configuration_markdown() -> str:
    """The text of `docs/configuration.md`: one table per section."""
    out = [
        "# Configuration",
        "",
        (
            "One settings object, `rag.Settings` (pydantic-settings). Each setting is read from, in"
            " order: a"
        ),
        (
            "CLI flag where the command has one, the environment variable, a `.env` file in the"
            " current"
        ),
        (
            "directory, the default. In Python, pass any setting as a keyword: `RAG(top_k=8,"
            ' llm="local")`.'
        ),
        "`rag doctor` says which LLM and store are configured.",
        "",
        "This page and [`.env.example`](../.env.example) are written from `rag/config.py` by",
        "`python -m rag.config_docs`; a test fails when they differ from it.",
    ]
    for name, field in _fields():
        if name in SECTIONS:
            out += [
                "",
                f"## {SECTIONS[name]}",
                "",
                "| variable | default | what it does |",
                "|---|---|---|",
            ]
        names = " or ".join(f"`{n}`" for n in variables(name, field))
        default = default_text(name, field)
        default = f"`{default}`" if default and name not in _COMPUTED else default or "unset"
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| {names} | {default} | {text} |")
    return "\n".join(out) + "\n"


RULES_BEGIN = (
    "<!-- rules: written by `python -m rag.config_docs` from rag/answer/rules/__init__.py -->"
)
RULES_END = "<!-- end of the rules -->"
ANSWERS_PAGE = REPO / "docs" / "answers.md"


def _threshold(name: str) -> str:
    """A Settings field as its variable and default, a constant as module.NAME, anything else as
    written."""
    field = Settings.model_fields.get(name)
    if field is not None:
        return f"`{variables(name, field)[0]}` ({default_text(name, field)})"
    return f"`{name}`" if "." in name else name


def rules_table() -> str:
    """The table of rules as markdown rows, in the order they run."""
    from rag.answer.rules import GATES, RULES

    out = [
        "| # | rule | when | holds back as | off with | thresholds | applies to | what it does |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(RULES, start=1):
        when = "before the model" if r in GATES else "after"
        off = ""
        if r.setting:
            off = f"`{variables(r.setting, Settings.model_fields[r.setting])[0]}=false`"
        name = f"[`{r.name}`]({r.doc_anchor})"
        label = f"`{r.label}`" if r.label else ""
        thresholds = ", ".join(_threshold(t) for t in r.thresholds)
        applies = ", ".join(r.applies_to)
        summary = r.summary.replace("|", "\\|")
        out.append(
            f"| {i} | {name} | {when} | {label} | {off} | {thresholds} | {applies} | {summary} |"
        )
    return "\n".join(out)


def answers_markdown() -> str:
    """docs/answers.md with its table of rules written from the table (the rest as it stands)."""
    text = ANSWERS_PAGE.read_text(encoding="utf-8")
    head, _, rest = text.partition(RULES_BEGIN)
    _, _, tail = rest.partition(RULES_END)
    return f"{head}{RULES_BEGIN}\n{rules_table()}\n{RULES_END}{tail}"


TARGETS = {
    REPO / ".env.example": env_example,
    REPO / "docs" / "configuration.md": configuration_markdown,
    ANSWERS_PAGE: answers_markdown,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(
            "Write .env.example and docs/configuration.md from Settings, and docs/answers.md's"
            " table of rules from rag/answer/rules."
        )
    )
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if either file differs from Settings"
    )
    args = ap.parse_args(argv)
    stale = []
    for path, make in TARGETS.items():
        text = make()
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"rag.config_docs: {', '.join(stale)} differ from rag/config.py; run python -m"
            " rag.config_docs",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
