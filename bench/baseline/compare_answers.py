"""Our answers beside the plain-LlamaIndex baseline on the same questions: the figures of a
`bench.answers.quality --json` run restricted to the questions a `bench.baseline.citations --json`
run asked (it asks a sample of them: `--same-as ... --limit N`), next to the baseline's own figures.
Ours twice: as shipped (the answerability check at `--threshold` and the support rule applied, as
`bench.answers.quality --as-shipped` does from a run with both off) and the model alone.

    python -m bench.baseline.compare_answers bench/results/answers_seeds_qwen.json \
        bench/results/citation_baseline_seeds_qwen.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.answers.quality import as_shipped, fmt, summarize

ROWS = (
    "citations_supported",
    "claims_with_citation",
    "markers_to_no_source",
    "answers_with_citation",
    "abstention_precision",
    "recall_not-covered",
    "recall_near-miss",
    "recall_off-topic",
    "answerable_refused",
    "key_fact_recall",
    "total_p50",
    "questions",
)


def our_records(path: Path, ids: set[str]) -> list[dict]:
    """`bench.answers.quality`'s saved answers, back as the records `summarize` reads."""
    from rag.models import Answer, Citation

    records = []
    for a in json.loads(path.read_text())["answers"]:
        if a["id"] not in ids:
            continue
        answer = Answer(
            question=a["question"],
            answer=a["answer"],
            mode=a["mode"],
            abstained=a["abstained"],
            abstained_by=a["abstained_by"],
            answerable=a.get("answerable"),
            citations=[Citation(**c) for c in a["citations"]],
            grounding=a.get("grounding"),
            uncited_sentences=a["uncited_sentences"],
            removed_markers=a["removed_markers"],
            error=a["error"],
        )
        row = {k: a[k] for k in ("id", "kind", "subkind", "question", "gold", "key_facts")}
        records.append({"row": row, "answer": answer, "ttft": a["ttft"], "total": a["total"]})
    return records


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("ours", type=Path, help="`python -m bench.answers.quality --json` output")
    ap.add_argument(
        "baseline", type=Path, help="`python -m bench.baseline.citations --json` output"
    )
    ap.add_argument(
        "--threshold",
        type=float,
        default=0.8,
        help="the check's threshold as shipped (RAG_LLM_CHECK_THRESHOLD)",
    )
    args = ap.parse_args()
    base = json.loads(args.baseline.read_text())
    if not base.get("figures"):
        sys.exit(f"{args.baseline} holds no figures (the run did not finish)")
    ids = {a["id"] for a in base["answers"]}
    records = our_records(args.ours, ids)
    shipped, alone = summarize(as_shipped(records, args.threshold)), summarize(records)
    print(
        f"| figure ({len(ids)} questions) | ours as shipped | ours, model alone |"
        " CitationQueryEngine |"
    )
    print("|---|---|---|---|")
    for key in ROWS:
        cells = []
        for figures in (shipped, alone, base["figures"]):
            value = figures.get(key)
            cells.append(
                fmt(value)
                if isinstance(value, dict) and "value" in value
                else (f"{value:.1f} s" if isinstance(value, float) else str(value))
            )
        print(f"| {key} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
