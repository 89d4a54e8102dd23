"""Question files of `rag eval`: one JSON object per line, `{id, question, gold: [paper ids], kind,
key_facts?, subkind?}` (see `eval/README.md`), checked by `load_questions`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from rag.errors import InputError, RagError
from rag.evaluation.metrics import OVERALL, UNANSWERABLE_SUBKINDS


class _QuestionFields(TypedDict):
    id: str
    question: str
    gold: list[str]  # relevant paper ids; empty for an unanswerable question
    kind: str
    key_facts: list[str]
    line: int  # in the question file


class Question(_QuestionFields, total=False):
    """A checked question-file item, as `load_questions` returns it."""

    subkind: str  # unanswerable questions only: one of UNANSWERABLE_SUBKINDS


# ---- question files --------------------------------------------------------------------------


def load_questions(path: str | Path) -> list[Question]:
    """Read and validate a question file. A bad line raises `InputError("file:line: what is
    wrong")`."""
    from rag.answer.question import clean_question

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a .jsonl file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(item, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(item).__name__}")
        for key in ("id", "question", "gold", "kind"):
            if key not in item:
                raise InputError(f"{where}: missing field {key!r}")
        qid = item["id"]
        if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
            raise InputError(f"{where}: 'id' must be a non-empty string")
        qid = str(qid)
        if qid in seen:
            raise InputError(f"{where}: duplicate id {qid!r} (first on line {seen[qid]})")
        seen[qid] = lineno
        if not isinstance(item["question"], str):
            raise InputError(f"{where}: 'question' must be text")
        try:
            question = clean_question(item["question"])
        except RagError as exc:
            raise InputError(f"{where}: {exc}") from None
        kind = item["kind"]
        if not isinstance(kind, str) or not kind.strip():
            raise InputError(f"{where}: 'kind' must be a non-empty string")
        if kind.strip() == OVERALL:
            raise InputError(f"{where}: kind {OVERALL!r} is reserved for the totals")
        gold = item["gold"]
        if not isinstance(gold, list) or not all(isinstance(g, str) and g.strip() for g in gold):
            raise InputError(f"{where}: 'gold' must be a list of paper ids (strings)")
        gold = [g.strip() for g in gold]
        if len(set(gold)) != len(gold):
            raise InputError(f"{where}: 'gold' repeats a paper id")
        facts = item.get("key_facts", [])
        if facts is None:
            facts = []
        if not isinstance(facts, list) or not all(isinstance(f, str) and f.strip() for f in facts):
            raise InputError(f"{where}: 'key_facts' must be a list of non-empty strings")
        subkind = item.get("subkind")
        if subkind is not None and (gold or subkind not in UNANSWERABLE_SUBKINDS):
            raise InputError(
                f"{where}: 'subkind' is for unanswerable questions (empty gold), one of "
                f"{', '.join(UNANSWERABLE_SUBKINDS)}"
            )
        checked: Question = {
            "id": qid,
            "question": question,
            "gold": gold,
            "kind": kind.strip(),
            "key_facts": facts,
            "line": lineno,
        }
        if subkind:
            checked["subkind"] = subkind
        questions.append(checked)
    if not questions:
        raise InputError(f"{path}: no questions")
    return questions
