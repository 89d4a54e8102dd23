"""Validate eval/seed_questions.jsonl against the seed corpus and print a summary.

Checks: valid JSON with the required fields; unique ids whose prefix matches the kind; known kinds;
every gold id is a seed paper id; unanswerable items have empty gold, the others non-empty gold;
each key fact occurs (after light normalisation of LaTeX/markup) in some gold abstract; paraphrase
questions share no acronym / method-name token with their gold paper's title or abstract.
Exit code 1 on any error. Usage (from the repository root):
python -m eval.validate_questions [FILE]
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path

from eval.print_seeds import load_seeds

KINDS = {"keyword": "k", "paraphrase": "p", "numeric": "n", "multi": "m", "unanswerable": "u"}
MINIMUM = {"keyword": 20, "paraphrase": 25, "numeric": 15, "multi": 10, "unanswerable": 40}


def read_questions(path: str) -> tuple[list[dict], list[str]]:
    """The items of a JSONL question file, and errors for bad JSON and repeated ids or questions."""
    items, errors = [], []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as e:
            errors.append(f"line {n}: bad JSON: {e}")
    ids = Counter(it.get("id") for it in items)
    errors += [f"duplicate id {i}" for i, c in ids.items() if c > 1]
    qs = Counter(it.get("question", "").strip().lower() for it in items)
    errors += [f"duplicate question {q!r}" for q, c in qs.items() if c > 1]
    return items, errors


def norm(s: str) -> str:
    s = s.replace("\\times", "x").replace("×", "x").replace("\\%", "%").replace("\\sim", "~")
    s = re.sub(r"\\(textbf|textit|emph|texttt|textsc|underline)\{", "", s)
    s = re.sub(r"[${}*\\]", "", s)
    s = (
        s.replace("–", "-")
        .replace("—", "-")
        .replace("’", "'")
        .replace("``", '"')
        .replace("''", '"')
    )
    return re.sub(r"\s+", " ", s).lower()


def distinctive_tokens(text: str) -> set:
    """Acronyms and method-like names: tokens with 2+ capitals or mixing letters and digits."""
    toks = set()
    for t in re.findall(r"[A-Za-z][A-Za-z0-9+\-]*[A-Za-z0-9+]", text):
        if sum(c.isupper() for c in t) >= 2 or (re.search(r"\d", t) and re.search(r"[A-Za-z]", t)):
            toks.add(t.lower())
    return toks


def main(path: str) -> int:
    seeds = {p["id"]: p for p in load_seeds()}
    items, errors = read_questions(path)
    warnings: list[str] = []
    gold_use = Counter()
    for it in items:
        iid, kind, gold = it.get("id"), it.get("kind"), it.get("gold")
        for field in ("id", "question", "gold", "kind"):
            if field not in it:
                errors.append(f"{iid}: missing {field}")
        if kind not in KINDS:
            errors.append(f"{iid}: unknown kind {kind}")
            continue
        if not re.fullmatch(KINDS[kind] + r"\d{2,}", str(iid)):
            errors.append(f"{iid}: id prefix does not match kind {kind}")
        if not isinstance(gold, list):
            errors.append(f"{iid}: gold must be a list")
            continue
        for g in gold:
            if g not in seeds:
                errors.append(f"{iid}: gold id {g} is not a seed paper")
        if len(set(gold)) != len(gold):
            errors.append(f"{iid}: repeated gold id")
        gold_use.update(gold)
        if kind == "unanswerable":
            if gold:
                errors.append(f"{iid}: unanswerable must have empty gold")
            continue
        if not gold:
            errors.append(f"{iid}: {kind} needs gold")
        if kind == "multi" and len(gold) < 2:
            errors.append(f"{iid}: multi needs 2+ gold papers")
        if kind != "multi" and len(gold) != 1:
            warnings.append(f"{iid}: {kind} with {len(gold)} gold papers")
        text = " ".join(
            norm(seeds[g]["title"] + " " + seeds[g]["abstract"]) for g in gold if g in seeds
        )
        for fact in it.get("key_facts", []):
            if norm(fact) not in text:
                errors.append(f"{iid}: key fact {fact!r} not found in gold abstract(s)")
        if kind in ("keyword", "paraphrase", "numeric") and not it.get("key_facts"):
            warnings.append(f"{iid}: no key_facts")
        if kind == "paraphrase":
            src = " ".join(
                seeds[g]["title"] + " " + seeds[g]["abstract"] for g in gold if g in seeds
            )
            leak = distinctive_tokens(it["question"]) & distinctive_tokens(src)
            if leak:
                errors.append(f"{iid}: paraphrase question uses distinctive term(s) {sorted(leak)}")
    counts = Counter(it.get("kind") for it in items)
    print(f"{path}: {len(items)} questions")
    for kind, minimum in MINIMUM.items():
        flag = "ok" if counts[kind] >= minimum else f"BELOW MINIMUM {minimum}"
        print(f"  {kind:13s} {counts[kind]:4d}  ({flag})")
        if counts[kind] < minimum:
            errors.append(f"{kind}: {counts[kind]} < {minimum}")
    print(f"  seed papers used as gold: {len(gold_use)}/{len(seeds)}")
    unused = sorted(set(seeds) - set(gold_use))
    if unused:
        print(f"  never gold: {', '.join(unused)}")
    for w in warnings:
        print("warning:", w)
    for e in errors:
        print("ERROR:", e)
    print("OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(
        main(
            sys.argv[1]
            if len(sys.argv) > 1
            else str(Path(__file__).resolve().parent / "seed_questions.jsonl")
        )
    )
