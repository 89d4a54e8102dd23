"""Answer quality and speed on a question set: abstention, citation support, time to first token.

    python bench/answers.py [--questions eval/seed_questions.jsonl] [--store DIR] [--every K] [--limit N] [--no-llm]

With an LLM configured (OPENAI_BASE_URL + RAG_LLM_MODEL, or RAG_LLM=local) it asks every question
through `RAG.stream` and reports:
- abstention precision/recall on the empty-gold questions (final answers, LLM refusals included),
- the retrieval-level abstention sweep (best dense similarity vs threshold, names in the question),
- the share of citations marked supported, answers with at least one citation, mean grounding,
- time to first streamed character and total time per answer (p50/p95).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def prf(predicted: list[bool], truth: list[bool]) -> tuple[float, float]:
    tp = sum(p and t for p, t in zip(predicted, truth))
    return tp / max(sum(predicted), 1), tp / max(sum(truth), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/seed_questions.jsonl")
    ap.add_argument("--store", type=Path, help="store directory (default: RAG_STORE_DIR or store/)")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--every", type=int, default=1, help="only every K-th question (a spread sample)")
    ap.add_argument("--no-llm", action="store_true", help="extractive answers")
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args()

    from rag import RAG, Answer

    rag = RAG(**({"store_dir": args.store} if args.store else {}))
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()][:: args.every][: args.limit]
    use_llm = not args.no_llm and rag.settings.llm_backend != "none"
    print(f"{len(rows)} questions; answers: {'LLM ' + rag.llm.label if use_llm else 'extractive'}")

    records = []
    for row in rows:
        hits = rag.retrieve(row["question"], k=args.k)
        best_sim = max([h.similarity for h in hits if h.similarity is not None] or [0.0])
        start, first = time.perf_counter(), None
        answer = None
        for piece in rag.stream(row["question"], k=args.k, llm=use_llm):
            if isinstance(piece, Answer):
                answer = piece
            elif piece and first is None:
                first = time.perf_counter() - start
        total = time.perf_counter() - start
        records.append({"row": row, "answer": answer, "ttft": first or total, "total": total,
                        "best_sim": best_sim, "named": any(h.named for h in hits)})
        sys.stderr.write(".")
        sys.stderr.flush()
    sys.stderr.write("\n")

    truth = [not r["row"]["gold"] for r in records]
    p, r = prf([rec["answer"].abstained for rec in records], truth)
    print(f"\nabstention (final answers): precision {p:.2f}, recall {r:.2f} "
          f"({sum(truth)} unanswerable of {len(records)})")
    print("\nretrieval-level abstention sweep (abstain when no name in the question is rare in the corpus "
          "and the best dense similarity < t):")
    print("| t | abstained | precision | recall |\n|---|---|---|---|")
    for t in (0.2, 0.25, 0.3, 0.35, 0.4):
        pred = [not rec["named"] and rec["best_sim"] < t for rec in records]
        pp, rr = prf(pred, truth)
        print(f"| {t:.2f} | {sum(pred)} | {pp:.2f} | {rr:.2f} |")

    answered = [rec for rec in records if not rec["answer"].abstained and rec["answer"].error is None]
    citations = [c for rec in answered for c in rec["answer"].citations]
    supported = sum(1 for c in citations if c.supported)
    groundings = [rec["answer"].grounding for rec in answered if rec["answer"].grounding is not None]
    errors = [rec["answer"].error for rec in records if rec["answer"].error]
    print(f"\nanswers given: {len(answered)}; with at least one citation: "
          f"{sum(1 for rec in answered if rec['answer'].citations)}")
    print(f"citations marked supported: {supported} of {len(citations)} "
          f"({supported / max(len(citations), 1):.0%}); mean grounding {statistics.fmean(groundings) if groundings else 0:.2f}")
    if errors:
        print(f"LLM errors: {len(errors)} (first: {errors[0]})")
    ttft = [rec["ttft"] for rec in records]
    total = [rec["total"] for rec in records]
    print(f"time to first character: p50 {pct(ttft, .5):.2f} s, p95 {pct(ttft, .95):.2f} s; "
          f"total: p50 {pct(total, .5):.2f} s, p95 {pct(total, .95):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
