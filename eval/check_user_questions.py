"""Check eval/user_questions.jsonl against the seed abstracts and print counts.

Checks: valid JSON with the required fields; unique ids whose prefix matches the kind
(e keyword, p paraphrase, n numeric, w multi, x near-miss, c not-covered, o off-topic);
every gold id is a seed paper; single-paper kinds have exactly one gold paper and 1-3 key facts
(2-6 words each for keyword/paraphrase); multi has 1-6 gold papers; every key fact is a
case-sensitive substring of a gold abstract (of some gold abstract for multi) after LaTeX/markup
is stripped ($, \\textbf{..}, \\%, **, *); unanswerable items have empty gold and key_facts, a
known subkind, and near misses name a seed paper in "about"; paraphrase questions share no acronym
or method-like token with their gold paper; heldout is true exactly for odd-numbered ids; the
per-kind counts match the brief. Exit code 1 on any error.

Usage (from the repository root): python -m eval.check_user_questions [FILE]
"""

import re
import sys
from collections import Counter
from pathlib import Path

from eval.print_seeds import load_seeds
from eval.validate_questions import distinctive_tokens, read_questions

HERE = Path(__file__).resolve().parent

# (kind, subkind) -> (id prefix, expected count)
SPEC = {
    ("keyword", None): ("e", 18),
    ("paraphrase", None): ("p", 18),
    ("numeric", None): ("n", 18),
    ("multi", None): ("w", 16),
    ("unanswerable", "near-miss"): ("x", 14),
    ("unanswerable", "not-covered"): ("c", 8),
    ("unanswerable", "off-topic"): ("o", 4),
}
REQUIRED = ("id", "question", "gold", "kind", "key_facts", "heldout")


def strip_markup(s: str) -> str:
    """Remove LaTeX/markdown markup but keep the characters (case-sensitive)."""
    s = s.replace("$", "")
    s = re.sub(r"\\(textbf|textit|emph|texttt|textsc|underline|url)\{", "", s)
    s = s.replace("\\%", "%").replace("\\times", "x").replace("\\sim", "~").replace("\\&", "&")
    s = s.replace("{", "").replace("}", "").replace("*", "")
    return re.sub(r"\s+", " ", s)


def main(path: str) -> int:
    seeds = {p["id"]: p for p in load_seeds()}
    clean = {pid: strip_markup(p["abstract"]) for pid, p in seeds.items()}
    items, errors = read_questions(path)

    counts, held, gold_papers = Counter(), Counter(), set()
    for it in items:
        iid = it.get("id", "?")
        missing = [f for f in REQUIRED if f not in it]
        if missing:
            errors.append(f"{iid}: missing {missing}")
            continue
        kind, sub, gold, facts = it["kind"], it.get("subkind"), it["gold"], it["key_facts"]
        key = (kind, sub if kind == "unanswerable" else None)
        if key not in SPEC:
            errors.append(f"{iid}: unknown kind/subkind {key}")
            continue
        prefix, _ = SPEC[key]
        m = re.fullmatch(prefix + r"(\d{2})", str(iid))
        if not m:
            errors.append(f"{iid}: id prefix does not match {key}")
            continue
        counts[key] += 1
        if it["heldout"] is not (int(m.group(1)) % 2 == 1):
            errors.append(f"{iid}: heldout must be {int(m.group(1)) % 2 == 1} (odd ids heldout)")
        held[key] += it["heldout"] is True
        if not isinstance(gold, list) or not isinstance(facts, list):
            errors.append(f"{iid}: gold and key_facts must be lists")
            continue
        for g in gold:
            if g not in seeds:
                errors.append(f"{iid}: gold id {g} is not a seed paper")
        if len(set(gold)) != len(gold):
            errors.append(f"{iid}: repeated gold id")

        if kind == "unanswerable":
            if gold or facts:
                errors.append(f"{iid}: unanswerable needs empty gold and key_facts")
            if sub == "near-miss":
                about = it.get("about")
                if not (isinstance(about, list) and len(about) == 1 and about[0] in seeds):
                    errors.append(f"{iid}: near-miss needs about=[seed id]")
            continue

        gold_papers.update(gold)
        if kind == "multi":
            if not 1 <= len(gold) <= 6:
                errors.append(f"{iid}: multi needs 1-6 gold papers, has {len(gold)}")
        elif len(gold) != 1:
            errors.append(f"{iid}: {kind} needs exactly one gold paper")
        if kind != "multi" and not 1 <= len(facts) <= 3:
            errors.append(f"{iid}: {kind} needs 1-3 key facts")
        if kind == "multi" and not facts:
            errors.append(f"{iid}: multi needs key facts")
        for f in facts:
            if not any(f in clean.get(g, "") for g in gold):
                errors.append(f"{iid}: key fact {f!r} is not a substring of a gold abstract")
            if kind in ("keyword", "paraphrase") and not 2 <= len(f.split()) <= 6:
                errors.append(f"{iid}: key fact {f!r} should be 2-6 words")
        if kind == "paraphrase":
            src = " ".join(
                seeds[g]["title"] + " " + seeds[g]["abstract"] for g in gold if g in seeds
            )
            leak = distinctive_tokens(it["question"]) & distinctive_tokens(src)
            if leak:
                errors.append(f"{iid}: paraphrase uses distinctive term(s) {sorted(leak)}")

    print(f"{path}: {len(items)} questions")
    for key, (_prefix, want) in SPEC.items():
        name = key[0] if key[1] is None else f"{key[0]}/{key[1]}"
        ok = counts[key] == want and held[key] * 2 == counts[key]
        print(
            f"  {name:26s} {counts[key]:3d} (want {want}), heldout {held[key]} "
            f" {'ok' if ok else 'MISMATCH'}"
        )
        if not ok:
            errors.append(f"{name}: count {counts[key]} (want {want}) / heldout {held[key]}")
    multi = [it for it in items if it.get("kind") == "multi"]
    multi2 = sum(len(it["gold"]) >= 2 for it in multi)
    print(f"  multi with >=2 gold: {multi2}/{len(multi)}")
    if multi and multi2 * 2 < len(multi):
        errors.append("fewer than half of the multi questions have >=2 gold papers")
    single = {
        g
        for it in items
        if it.get("kind") in ("keyword", "paraphrase", "numeric")
        for g in it["gold"]
    }
    print(
        f"  distinct gold papers: {len(gold_papers)}/{len(seeds)} "
        f"(single-paper kinds: {len(single)})"
    )
    for e in errors:
        print("ERROR:", e)
    print("OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(HERE / "user_questions.jsonl")))
