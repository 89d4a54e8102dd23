"""Print each seed paper's id, title and abstract (for writing/reviewing the eval question set).

Usage (from the repository root): python -m eval.print_seeds
"""

import json
import re
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def load_seeds():
    meta = {}
    for line in (CORPUS / "seed_metadata.jsonl").read_text().splitlines():
        if line.strip():
            m = json.loads(line)
            meta[(m["seed_file"], m["index"])] = m
    papers = []
    for f in sorted(CORPUS.glob("*.txt")):
        text = f.read_text()
        body = text.split("\n", 1)[1]
        paras = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]
        for i, p in enumerate(paras, 1):
            m = meta[(f.name, i)]
            pid = re.search(r"id=([^&]+)", m["openreview_url"]).group(1)
            papers.append(
                {"id": pid, "title": m["title"], "abstract": p, "file": f.name, "index": i}
            )
    return papers


if __name__ == "__main__":
    ps = load_seeds()
    for n, p in enumerate(ps, 1):
        print(f"### [{n}] {p['id']} | {p['title']}\n{p['abstract']}\n")
    print(len(ps), "papers", len({p["id"] for p in ps}), "unique ids", file=sys.stderr)
