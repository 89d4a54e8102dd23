"""Finished study: a gate on the model's P(yes) per paper; not built (docs/lab/answers-history.md,
"Tried and not kept").

Would the local model tell a paper that fits a question from one that does not? P(yes) of one token,
asked in a fresh prompt per paper: the question, the paper's title and its sentence closest to the
question. Prints, per question, the top papers' P(yes), gold papers marked G.

    RAG_LLM=local python -m bench.studies.list_fit --store DIR [--questions
eval/user_questions.jsonl] [--kinds cwpe]

`--kinds`: the first letters of the question ids to ask (c not covered, w which papers, p
paraphrased, e exact wording, x near misses). A measurement for docs/lab/answers-history.md ("Tried
and not kept"); the product does not ask this.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO

SYSTEM = "You judge whether a research paper is relevant to a user's question. Reply yes or no."
USER = (
    "Question: {q}\n\nPaper: {title}\nFrom its abstract: {sentence}\n\n"
    "Is this paper about what the question asks about? Reply yes or no."
)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument("--kinds", default="cwpe")
    ap.add_argument("--top", type=int, default=3)
    args = ap.parse_args()

    import numpy as np

    from rag import RAG
    from rag.answer import evidence

    rag = RAG(store_dir=args.store)
    llm = rag.llm
    if llm is None:
        print("list_fit: set RAG_LLM=local (or an endpoint)", file=sys.stderr)
        return 1
    questions = [
        json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()
    ]
    for q in sorted(
        (q for q in questions if q["id"][0] in args.kinds),
        key=lambda q: args.kinds.index(q["id"][0]),
    ):
        hits = rag._retrieve(q["question"], 5)[: args.top]
        row = []
        for hit in hits:
            sentences = evidence.source_sentences(hit.chunk.abstract)
            if not sentences:
                continue
            vectors = np.asarray(
                rag.embedder.embed([q["question"], *sentences], truncate=True), dtype=np.float32
            )
            best = sentences[int(np.argmax(vectors[1:] @ vectors[0]))]
            p = llm.yes_probability(
                [
                    {"role": "system", "content": SYSTEM},
                    {
                        "role": "user",
                        "content": USER.format(
                            q=q["question"],
                            title=evidence.plain_prose(hit.paper.title),
                            sentence=best,
                        ),
                    },
                ]
            )
            row.append(f"{'G' if hit.paper.paper_id in q['gold'] else '-'}{p:.2f}")
        print(q["id"], q.get("subkind") or q["kind"], " ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
