"""Check eval/two_part_questions.jsonl and eval/list_questions.jsonl against the seed abstracts.

Two-part set (t01...): unique ids t\\d\\d, kind "two_part", a known `form`, 1-2 gold seed papers,
exactly two parts, each with `ask`, `key_facts` and `stated`; a stated part has 1+ key facts, a
near-miss part (`stated: false`) has none; with two gold papers each part names its `paper` (one of
the gold) and the parts cover both; every key fact is an exact (case-sensitive, LaTeX/markup as
written) substring of its part's gold abstract (of some gold abstract when the part names no paper);
the top-level `key_facts` is the parts' facts in order. List set (l01...): unique ids l\\d\\d, kind
"multi", 1-8 distinct gold seed papers, one key fact per gold paper that is an exact substring of
that paper's abstract, `not_gold` entries name seed papers outside gold with a `why`. Both:
`heldout` is a bool and the held-out half is balanced (|heldout - n/2| <= 1 overall, and within each
two-part form, among near-miss questions, among two-paper questions, among single-gold and not_gold
list questions, at most one off an even split). Exit code 1 on any error.

Usage (from the repository root): python -m eval.check_new_sets [TWO_PART_FILE] [LIST_FILE]
"""

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from eval.print_seeds import load_seeds

HERE = Path(__file__).resolve().parent
FORMS = {"and", "what_how_many", "how_compare", "also", "plus", "two_sentences", "what_why"}


def read(path, errors):
    items = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            errors.append(f"{path}:{n}: bad JSON: {exc}")
    return items


def balanced(label, flags, errors, lines):
    n, h = len(flags), sum(flags)
    lines.append(f"  {label}: {n} questions, {h} held out")
    if abs(h - n / 2) > 1:
        errors.append(f"held-out split unbalanced for {label}: {h} of {n}")


def check_two_part(path, seeds, errors, lines):
    items = read(path, errors)
    ids = Counter(it.get("id") for it in items)
    for i, c in ids.items():
        if c > 1:
            errors.append(f"{path}: duplicate id {i}")
    by_form, near, two, allh = defaultdict(list), [], [], []
    n_near_parts = 0
    for it in items:
        iid = it.get("id", "?")
        if not re.fullmatch(r"t\d{2}", str(iid)):
            errors.append(f"{iid}: id must be t01, t02, ...")
        if it.get("kind") != "two_part":
            errors.append(f"{iid}: kind must be two_part")
        if it.get("form") not in FORMS:
            errors.append(f"{iid}: unknown form {it.get('form')!r}")
        if not isinstance(it.get("heldout"), bool):
            errors.append(f"{iid}: heldout must be true/false")
            continue
        gold = it.get("gold", [])
        if not (1 <= len(gold) <= 2) or len(set(gold)) != len(gold):
            errors.append(f"{iid}: gold must be 1-2 distinct papers")
        for g in gold:
            if g not in seeds:
                errors.append(f"{iid}: gold {g} is not a seed paper")
        parts = it.get("parts", [])
        if len(parts) != 2:
            errors.append(f"{iid}: needs exactly two parts")
            continue
        named = set()
        has_near = False
        flat = []
        for k, p in enumerate(parts, 1):
            where = f"{iid} part {k}"
            if not isinstance(p.get("ask"), str) or not p["ask"].strip():
                errors.append(f"{where}: missing ask")
            facts, stated = p.get("key_facts"), p.get("stated")
            if not isinstance(facts, list) or not isinstance(stated, bool):
                errors.append(f"{where}: key_facts must be a list and stated a bool")
                continue
            if stated and not facts:
                errors.append(f"{where}: a stated part needs key facts")
            if not stated:
                has_near = True
                n_near_parts += 1
                if facts:
                    errors.append(
                        f"{where}: a near-miss part (stated: false) must have no key facts"
                    )
            paper = p.get("paper")
            if len(gold) == 2 and paper not in gold:
                errors.append(f"{where}: with two gold papers each part must name one as 'paper'")
            if paper:
                named.add(paper)
            texts = [seeds[paper]] if paper in seeds else [seeds[g] for g in gold if g in seeds]
            for f in facts:
                flat.append(f)
                if not any(f in t for t in texts):
                    errors.append(f"{where}: key fact not verbatim in the gold abstract: {f!r}")
        if len(gold) == 2 and named != set(gold):
            errors.append(f"{iid}: the two parts must cover both gold papers")
        if it.get("key_facts", flat) != flat:
            errors.append(f"{iid}: top-level key_facts must be the parts' key facts in order")
        by_form[it.get("form")].append(it["heldout"])
        allh.append(it["heldout"])
        if has_near:
            near.append(it["heldout"])
        if len(gold) == 2:
            two.append(it["heldout"])
    lines.append(
        f"{path}: {len(items)} questions, {n_near_parts} near-miss parts "
        f"in {len(near)} questions, {len(two)} about two papers"
    )
    balanced("all", allh, errors, lines)
    for form in sorted(by_form):
        balanced(f"form {form}", by_form[form], errors, lines)
    balanced("with a near-miss part", near, errors, lines)
    balanced("about two papers", two, errors, lines)
    return items


def check_list(path, seeds, errors, lines):
    items = read(path, errors)
    ids = Counter(it.get("id") for it in items)
    for i, c in ids.items():
        if c > 1:
            errors.append(f"{path}: duplicate id {i}")
    allh, single, notg, sizes = [], [], [], Counter()
    for it in items:
        iid = it.get("id", "?")
        if not re.fullmatch(r"l\d{2}", str(iid)):
            errors.append(f"{iid}: id must be l01, l02, ...")
        if it.get("kind") != "multi":
            errors.append(f"{iid}: kind must be multi")
        if not isinstance(it.get("heldout"), bool):
            errors.append(f"{iid}: heldout must be true/false")
            continue
        gold, facts = it.get("gold", []), it.get("key_facts", [])
        if not (1 <= len(gold) <= 8) or len(set(gold)) != len(gold):
            errors.append(f"{iid}: gold must be 1-8 distinct papers")
        if len(facts) != len(gold):
            errors.append(f"{iid}: one key fact per gold paper ({len(facts)} for {len(gold)})")
        for g, f in zip(gold, facts):
            if g not in seeds:
                errors.append(f"{iid}: gold {g} is not a seed paper")
            elif f not in seeds[g]:
                errors.append(f"{iid}: key fact not verbatim in {g}'s abstract: {f!r}")
        for ng in it.get("not_gold", []):
            pid = ng.get("paper_id")
            if pid not in seeds:
                errors.append(f"{iid}: not_gold {pid} is not a seed paper")
            if pid in gold:
                errors.append(f"{iid}: not_gold {pid} is also gold")
            if not str(ng.get("why", "")).strip():
                errors.append(f"{iid}: not_gold {pid} needs a why")
        sizes[len(gold)] += 1
        allh.append(it["heldout"])
        if len(gold) == 1:
            single.append(it["heldout"])
        if it.get("not_gold"):
            notg.append(it["heldout"])
    lines.append(
        f"{path}: {len(items)} questions; gold sizes "
        + ", ".join(f"{k}:{v}" for k, v in sorted(sizes.items()))
    )
    balanced("all", allh, errors, lines)
    balanced("single gold paper", single, errors, lines)
    balanced("with not_gold", notg, errors, lines)
    return items


def main(argv):
    two_path = argv[1] if len(argv) > 1 else HERE / "two_part_questions.jsonl"
    list_path = argv[2] if len(argv) > 2 else HERE / "list_questions.jsonl"
    seeds = {p["id"]: p["abstract"] for p in load_seeds()}
    errors, lines = [], []
    two = check_two_part(two_path, seeds, errors, lines)
    lst = check_list(list_path, seeds, errors, lines)
    overlap = {it.get("id") for it in two} & {it.get("id") for it in lst}
    if overlap:
        errors.append(f"ids used in both files: {sorted(overlap)}")
    print("\n".join(lines))
    covered = {g for it in two + lst for g in it.get("gold", [])}
    print(f"{len(covered)} of {len(seeds)} seed papers are gold somewhere in the two files")
    for e in errors:
        print("ERROR", e)
    print("OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
