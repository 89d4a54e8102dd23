"""Extractive answers with and without remembered sentence vectors (rag/answer/sentence_vectors.py).

    python -m bench.speed.sentence_vectors [--store DIR] [--rounds 3]

Two engines on one store, both warmed by one question: `memo` (the product: questions and source
sentences remembered) and `plain` (capacity 0: every sentence embedded for every question, as
before). Each asks the same questions `--rounds` times, the engines taking turns so both see the
same machine; the first round of `memo` embeds everything, later rounds find the papers' sentences
remembered, as a chat's follow-ups and a server's popular papers do. Prints seconds per question
(median over questions) per round, the ratio, and the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.helpers import machine_load, percentile

QUESTIONS = [
    "What does Palimpsa use?",
    "How does Palimpsa relate to Mamba2?",
    "Which papers study diffusion models?",
    "What is test-time training?",
    "Which papers use reinforcement learning for reasoning?",
    "How are LLM agents evaluated?",
    "Which papers prune or quantize large language models?",
    "What methods make transformers more efficient on long contexts?",
]


def main(argv: list[str] | None = None) -> None:
    from rag import RAG

    parser = argparse.ArgumentParser(
        prog="python -m bench.speed.sentence_vectors", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--store", default=None, help="store directory (default: the default store)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="times each question is asked (default 3)"
    )
    args = parser.parse_args(argv)
    kw = {"store_dir": args.store} if args.store else {}
    memo, plain = RAG(llm="none", **kw), RAG(llm="none", **kw)
    plain.remember_vectors(capacity=0, query_capacity=0)
    for rag in (memo, plain):
        rag.ask("warm up: load the models and the index")
    print(
        f"{len(QUESTIONS)} questions x {args.rounds} rounds, extractive, store"
        f" {memo.settings.store_dir}; {machine_load()} at start"
    )
    times: dict[str, list[list[float]]] = {"plain": [], "memo": []}
    for _ in range(args.rounds):
        for name, rag in (("plain", plain), ("memo", memo)):
            row = []
            for q in QUESTIONS:
                t0 = time.perf_counter()
                rag.ask(q)
                row.append(time.perf_counter() - t0)
            times[name].append(row)
    print("round  plain s/q (p50, p95)   memo s/q (p50, p95)   plain/memo (p50)")
    for r in range(args.rounds):
        p, m = times["plain"][r], times["memo"][r]
        print(
            f"{r + 1:>5}  {statistics.median(p):.3f}, {percentile(p, 95):.3f}         "
            f"{statistics.median(m):.3f}, {percentile(m, 95):.3f}          "
            f"{statistics.median(p) / statistics.median(m):.1f}x"
        )
    print(f"{machine_load()} at end")


if __name__ == "__main__":
    main()
