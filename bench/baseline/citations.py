"""The plain-LlamaIndex route, as the baseline of `python -m bench.answers.quality`: LlamaIndex's
`CitationQueryEngine` over the same retriever (`RAG.retriever`, one node per paper) and the same
model endpoint, with LlamaIndex's own citation prompt and response synthesis. Same questions, same
figures:

    OPENAI_BASE_URL=... RAG_LLM_MODEL=... python -m bench.baseline.citations --store DIR
[--answerable-every K] [--json OUT]

Its answers are checked by our support check against the passages it was given (its "Source n"
numbering). It has no refusal phrase of its own ("If none of the sources are helpful, you should
indicate that"), so an answer counts as an abstention when it says so in one of the usual ways
(`ABSTAINS` below) and cites nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from bench.answers.quality import DEFAULT_QUESTIONS, fmt, interleave, summarize

ABSTAINS = re.compile(
    r"none of the (provided )?sources|sources? (do|does|did) not|no (relevant )?information|"
    r"not (mentioned|provided|specified|stated|included)|cannot (be )?(answer|determin)|"
    r"there is no (mention|information)|don't answer|do not answer|unable to",
    re.I,
)


def make_llm(base_url: str, model: str, api_key: str | None, max_tokens: int):
    """A LlamaIndex LLM for any OpenAI-compatible endpoint (the quickstart's OpenAILike, written
    out: that package is not a dependency of ours)."""
    import openai
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
    from llama_index.core.llms.callbacks import llm_completion_callback

    client = openai.OpenAI(base_url=base_url, api_key=api_key or "x")

    class EndpointLLM(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(context_window=4096, num_output=max_tokens, model_name=model)

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs) -> CompletionResponse:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                temperature=0.0,
                max_tokens=max_tokens,
            )
            return CompletionResponse(text=reply.choices[0].message.content or "")

        @llm_completion_callback()
        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs):
            text = self.complete(prompt).text
            yield CompletionResponse(text=text, delta=text)

    return EndpointLLM()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--questions", type=Path, nargs="+", default=DEFAULT_QUESTIONS)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--answerable-every", type=int, default=1)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--same-as",
        type=Path,
        metavar="JSON",
        help=(
            "ask exactly the questions of a `python -m bench.answers.quality --json` run (its"
            " sample)"
        ),
    )
    args = ap.parse_args()

    from llama_index.core.query_engine import CitationQueryEngine

    from rag import RAG, Answer
    from rag.answer.citations import check_support, renumber
    from rag.models import Source

    rag = RAG(store_dir=args.store)
    s = rag.settings
    engine = CitationQueryEngine(
        retriever=rag.retriever,
        llm=make_llm(s.openai_base_url, s.llm_model, s.openai_api_key, s.llm_max_tokens),
    )
    rows = [
        json.loads(line)
        for path in args.questions
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    rows = [r for i, r in enumerate(rows) if not r["gold"] or i % args.answerable_every == 0]
    if args.same_as:
        asked = {a["id"] for a in json.loads(args.same_as.read_text())["answers"]}
        rows = [r for r in rows if r["id"] in asked]
    # kinds in turn: a short or stopped run is still a spread sample
    rows = interleave(rows)[: args.limit]
    print(f"{len(rows)} questions; CitationQueryEngine with {s.llm_model} at {s.openai_base_url}")
    records = []
    for row in rows:
        start = time.perf_counter()
        response = engine.query(row["question"])
        total = time.perf_counter() - start
        sources = [
            Source(
                n=i,
                paper_id=node.node.metadata.get("paper_id", f"?{i}"),
                title=node.node.metadata.get("title", ""),
                score=max(0.0, min(1.0, node.score or 0.0)),
                passage=node.node.get_content(),
            )
            for i, node in enumerate(response.source_nodes, 1)
        ]
        text, final, invalid = renumber(str(response), sources)
        abstained = not any(x.cited for x in final) and bool(ABSTAINS.search(text))
        report = check_support(text, final, embed=lambda t: rag.embedder.embed(t, truncate=True))
        answer = Answer(
            question=row["question"],
            answer=text,
            mode="llm",
            abstained=abstained,
            abstained_by="model" if abstained else None,
            citations=[] if abstained else report.citations,
            sources=final,
            grounding=report.grounding,
            uncited_sentences=report.uncited,
            removed_markers=invalid,
        )
        records.append({"row": row, "answer": answer, "ttft": total, "total": total})
        sys.stderr.write("a" if abstained else ".")
        sys.stderr.flush()
        if args.json:  # after every answer: a run stopped early still leaves its answers
            write_json(args.json, records, None)
    sys.stderr.write("\n")
    result = summarize(records)
    for key, value in result.items():
        print(f"{key}: {fmt(value) if isinstance(value, dict) and 'value' in value else value}")
    if args.json:
        write_json(args.json, records, result)
    return 0


def write_json(path: Path, records: list[dict], figures: dict | None) -> None:
    path.write_text(
        json.dumps(
            {
                "label": "CitationQueryEngine",
                "figures": figures,
                "answers": [
                    {
                        "id": r["row"]["id"],
                        "answer": r["answer"].answer,
                        "abstained": r["answer"].abstained,
                        "cited": [x.paper_id for x in r["answer"].sources if x.cited],
                        "gold": r["row"]["gold"],
                    }
                    for r in records
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
