"""The support check against a reader: extract cited sentences from answer runs, then score the
check.

    python -m bench.answers.support_audit extract RUN.json [RUN.json ...] --store DIR --out
sentences.jsonl python -m bench.answers.support_audit score sentences.jsonl labels.jsonl

`extract` writes one line per (answer sentence, cited paper) of the answered questions of
`bench.answers.quality` runs: the sentence, the cited paper's whole abstract and title, and what the
check said (`check`: the verdict `rag.answer.citations.check_support` gives that sentence alone
against the abstract). Quoted sentences (lines starting "- ") are marked `quote`: supported by
construction, kept apart.

A reader then labels each line `supported` (every claim of the sentence is stated by the abstract),
`partly` (some is, some is not or is distorted) or `not`, in a JSONL of `{key, label, why}`.

`score` prints, over the labelled lines, the reader's shares and the check's precision and recall
for "supported" (a "partly" counts as not supported), each with a 95% Wilson interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def extract(args) -> int:
    from rag import RAG
    from rag.answer.citations import (
        MARKER,
        check_support,
        is_claim,
        parse_markers,
        plain_text,
        split_sentences,
    )
    from rag.models import Source

    rag = RAG(store_dir=args.store)
    embed = lambda texts: rag.embedder.embed(texts, truncate=True)  # noqa: E731
    abstracts = {paper.paper_id: (paper, text) for paper, text in rag.store.all_papers()}
    rows = []
    for run in args.runs:
        saved = json.loads(Path(run).read_text())
        for a in saved["answers"]:
            if a.get("outcome", "answered") != "answered" or a["mode"] != "llm" or a.get("error"):
                continue
            cited = a["cited"]  # paper ids in the answer's numbering, 1..m
            for sentence in split_sentences(a["answer"]):
                if not is_claim(sentence):
                    continue
                for n in dict.fromkeys(parse_markers(sentence)):
                    if not 1 <= n <= len(cited):
                        continue
                    paper, abstract = abstracts[cited[n - 1]]
                    alone = MARKER.sub("[1]", sentence)
                    source = Source(
                        n=1,
                        paper_id=paper.paper_id,
                        title=paper.display_title,
                        score=1.0,
                        passage=abstract,
                    )
                    report = check_support(alone, [source], embed=embed)
                    rows.append(
                        {
                            "key": f"{saved['label']}|{a['id']}|{len(rows)}",
                            "question": a["question"],
                            "sentence": plain_text(MARKER.sub("", sentence)).strip(),
                            "paper_id": paper.paper_id,
                            "title": paper.display_title,
                            "abstract": abstract,
                            "quote": sentence.lstrip().startswith("- "),
                            "check": bool(report.citations and report.citations[0].supported),
                        }
                    )
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} cited sentences ({sum(r['quote'] for r in rows)} quotes) -> {args.out}")
    return 0


def score(args) -> int:
    from rag.evaluation import interval95

    rows = {r["key"]: r for r in map(json.loads, Path(args.sentences).read_text().splitlines())}
    labels = {
        r["key"]: r["label"] for r in map(json.loads, Path(args.labels).read_text().splitlines())
    }
    pairs = [(rows[k], v) for k, v in labels.items() if k in rows]

    def share(hits: list[bool]) -> str:
        n = len(hits)
        if not n:
            return "-"
        lo, hi = interval95([float(h) for h in hits], [1.0] * n)
        return f"{sum(hits) / n:.2f} [{lo:.2f}, {hi:.2f}] (n={n})"

    for name, group in (
        ("all", pairs),
        ("synthesis", [p for p in pairs if not p[0]["quote"]]),
        ("quotes", [p for p in pairs if p[0]["quote"]]),
    ):
        if not group:
            continue
        print(
            f"{name}: reader says supported {share([lab == 'supported' for _, lab in group])}, "
            f"partly {share([lab == 'partly' for _, lab in group])}, "
            f"check says supported {share([r['check'] for r, _ in group])}"
        )
        marked = [lab == "supported" for r, lab in group if r["check"]]
        truly = [r["check"] for r, lab in group if lab == "supported"]
        caught = [not r["check"] for r, lab in group if lab != "supported"]
        print(
            f"    check precision (supported when it says so) {share(marked)}; recall"
            f" {share(truly)}; unsupported caught {share(caught)}"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("extract")
    e.add_argument("runs", nargs="+")
    e.add_argument("--store", type=Path, required=True)
    e.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score")
    s.add_argument("sentences", type=Path)
    s.add_argument("labels", type=Path)
    args = ap.parse_args()
    return extract(args) if args.command == "extract" else score(args)


if __name__ == "__main__":
    sys.exit(main())
