"""Does reranking with the model pay? Issue 14's `--rerank`, measured before it is built.

    RAG_LLM=local python -m bench.rerank --store DIR [--kinds paraphrase] [--every K] [--candidates 10]
        [--json OUT]

For each answerable question: the engine's top candidates (hybrid retrieval, as shipped), then the
model judges each one pointwise: "does this paper answer the question?", scored by P(yes) among
yes/no for the next token (`yes_probability`, the answerability check's own machinery, with the
question first so that llama.cpp reuses its prefix across the candidates). Candidates are reordered
by that score (ties keep retrieval order). Printed: hit@1 and hit@5 before and after, with 95%
intervals, and the time the judging takes beside the time the same question's answer takes to its
first character in the same run (the ratio is what reranking would add to the first token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.helpers import REPO, percentile, write_json

# Pointwise relevance: one token, read as P(yes). The question comes first so the candidates share
# the cached prefix.
RERANK_SYSTEM = ("You judge search results for a researcher. Given a question and one paper's abstract "
                 "passage, answer yes if the passage states the answer to the question, else no. "
                 "Answer with one word: yes or no.")


def rerank_messages(question: str, title: str, passage: str) -> list[dict]:
    return [{"role": "system", "content": RERANK_SYSTEM},
            {"role": "user", "content": f"Question: {question}\n\nPaper: {title}\n{passage}\n\n"
                                        "Does this paper state the answer to the question? yes or no"}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/seed_questions.jsonl")
    ap.add_argument("--kinds", default="paraphrase", help="comma-separated question kinds")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=10, help="top candidates the model judges")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rag import RAG
    from rag.evaluation import interval95

    rag = RAG(store_dir=args.store)
    backend = rag.llm
    if backend is None:
        sys.exit("set RAG_LLM=local (or an OpenAI-compatible endpoint): reranking needs a model")
    kinds = set(args.kinds.split(","))
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["gold"] and r["kind"] in kinds][:: args.every]
    print(f"{len(rows)} questions ({args.kinds}), {args.candidates} candidates judged by {backend.label}")
    records = []
    for row in rows:
        gold = set(row["gold"])
        sources = rag.search(row["question"], k=args.candidates)
        start = time.perf_counter()
        scores = [backend.yes_probability(rerank_messages(row["question"], s.title, s.passage)) for s in sources]
        judge = time.perf_counter() - start
        order = sorted(range(len(sources)), key=lambda i: (-scores[i], i))
        before = [s.paper_id for s in sources]
        after = [sources[i].paper_id for i in order]
        start = time.perf_counter()
        stream = rag.stream(row["question"])
        for piece in stream:
            if piece:
                break
        stream.close()
        ttft = time.perf_counter() - start
        records.append({"id": row["id"], "before": before, "after": after, "scores": scores,
                        "judge_s": judge, "answer_ttft_s": ttft,
                        "hit1_before": before[0] in gold if before else False,
                        "hit1_after": after[0] in gold if after else False,
                        "hit5_before": bool(gold & set(before[:5])), "hit5_after": bool(gold & set(after[:5]))})
        sys.stderr.write(f"{row['id']}: judged {len(sources)} in {judge:.1f}s, answer ttft {ttft:.1f}s, "
                         f"hit@1 {records[-1]['hit1_before']:d}->{records[-1]['hit1_after']:d}\n")
    figures = {}
    for key in ("hit1_before", "hit1_after", "hit5_before", "hit5_after"):
        hits = [float(r[key]) for r in records]
        ci = interval95(hits, [1.0] * len(hits))
        figures[key] = {"value": sum(hits) / len(hits), "n": len(hits), "ci95": ci}
        print(f"{key}: {figures[key]['value']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] (n={len(hits)})")
    judge = [r["judge_s"] for r in records]
    ttft = [r["answer_ttft_s"] for r in records]
    figures.update(judge_p50=percentile(judge, 50), judge_p95=percentile(judge, 95),
                   answer_ttft_p50=percentile(ttft, 50),
                   added_over_ttft_p50=percentile([j / t for j, t in zip(judge, ttft)], 50))
    print(f"judging p50 {figures['judge_p50']:.1f}s (p95 {figures['judge_p95']:.1f}s); the answer's first "
          f"character p50 {figures['answer_ttft_p50']:.1f}s; reranking adds {figures['added_over_ttft_p50']:.2f}x "
          "the first-token time")
    if args.json:
        write_json(args.json, {"label": backend.label, "candidates": args.candidates, "figures": figures,
                               "questions": records}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
