"""How many key facts reach the model, and how long the prompt is, for a given choice of sentences.

    python -m bench.answers.prompt_facts --store DIR [--questions FILE] [--top 400] [--other 60]
[--k 5]

For every question with key facts: the evidence prompt `rag/answer/evidence.py` builds (the best
source's sentences up to `--top` tokens, the others' closest sentences up to `--other` tokens, `--k`
sources), and whether each key fact appears in it. Prints the share of key facts in the prompt and
the p50/p90 of the question message's tokens (what the model reads beyond its cached system prompt).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO, percentile


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument("--top", type=int, default=400)
    ap.add_argument("--other", type=int, default=60)
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args()

    from rag import RAG
    from rag.answer import evidence
    from rag.text import count_tiktoken

    rag = RAG(store_dir=args.store)

    def embed(texts):
        return rag.embedder.embed(texts, truncate=True)

    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    sizes, found, total = [], 0, 0
    for row in rows:
        question = row["question"]
        hits = rag._retrieve(question, args.k)
        sources = rag.search(question, args.k)
        chosen = evidence.choose_sentences(
            question,
            [evidence.source_sentences(h.chunk.abstract) for h in hits],
            args.top,
            args.other,
            embed,
        )
        shown = [evidence.ShownSource(s.n, s.title, c) for s, c in zip(sources, chosen)]
        messages, _ = evidence.build_messages(
            question, shown, rag.settings.llm_context_tokens, evidence.is_list_question(question)
        )
        text = messages[-1]["content"]
        sizes.append(count_tiktoken(text))
        for fact in row.get("key_facts") or []:
            total += 1
            found += fact in text or evidence.plain_prose(fact) in text
    print(
        f"top {args.top}, other {args.other}, k {args.k}: key facts in the prompt {found}/{total} "
        f"({found / max(total, 1):.2f}); question message tokens p50 {percentile(sizes, 50):.0f}, "
        f"p90 {percentile(sizes, 90):.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
