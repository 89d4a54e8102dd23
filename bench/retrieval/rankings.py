#!/usr/bin/env python3
"""Dump or compare the rankings of every eval question: did a change move any result?

  python -m bench.retrieval.rankings dump --store DIR --out A.json [--modes bm25,dense,hybrid] [--k
10] python -m bench.retrieval.rankings diff A.json B.json

`dump` runs `RAG.search(question, k, mode)` for each question of eval/*.jsonl and writes the ranked
paper ids (and scores); `diff` says how many rankings are identical and lists those that moved. Run
`dump` from two checkouts (each from its own root, with its own python) on copies of one store to
compare them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO


def questions() -> list[str]:
    out: list[str] = []
    for path in sorted((REPO / "eval").glob("*.jsonl")):
        out += [
            json.loads(line)["question"]
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
    return list(dict.fromkeys(out))


def dump(args) -> int:
    from rag import RAG

    rag = RAG(store_dir=args.store, llm="none")
    out = {
        mode: {
            q: [[s.paper_id, round(s.score, 4)] for s in rag.search(q, k=args.k, mode=mode)]
            for q in questions()
        }
        for mode in args.modes.split(",")
    }
    Path(args.out).write_text(json.dumps(out), encoding="utf-8")
    return 0


def diff(args) -> int:
    a, b = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (args.a, args.b))
    moved_total = 0
    for mode in a:
        same = [
            q for q in a[mode] if [p for p, _ in a[mode][q]] == [p for p, _ in b[mode].get(q, [])]
        ]
        moved = [q for q in a[mode] if q not in same]
        moved_total += len(moved)
        print(f"{mode}: {len(same)}/{len(a[mode])} rankings identical")
        for q in moved:
            print(f"  moved: {q!r}\n    A {a[mode][q]}\n    B {b[mode].get(q)}")
    return 1 if moved_total else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--store", type=Path, required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--modes", default="bm25,dense,hybrid")
    d.add_argument("--k", type=int, default=10)
    c = sub.add_parser("diff")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args(argv)
    return dump(args) if args.cmd == "dump" else diff(args)


if __name__ == "__main__":
    sys.exit(main())
