"""Answer quality and speed on question sets: what the README's answer table quotes.

    python bench/answers.py --store DIR [--questions FILE ...] [--every K] [--limit N] [--no-llm]
                            [--direct] [--json OUT] [--label NAME]

Asks every question through `RAG.stream` with the configured LLM (OPENAI_BASE_URL + RAG_LLM_MODEL, or
RAG_LLM=local), or extractively with --no-llm, and prints, with 95% intervals (Wilson for shares of
questions, a seeded bootstrap over questions for other ratios):
- citations marked supported (of all citations), claim sentences that cite a source, markers that
  pointed at no source (removed);
- abstention precision; recall per unanswerable subkind (off-topic, not-covered, near-miss); the
  share of answerable questions refused; which mechanism abstained (retrieval rule, model refusal,
  answerability check);
- key-fact recall on answerable questions;
- time to first character and to the full answer (p50, p95).
--direct (OpenAI-compatible endpoints) then sends each question's same prompt straight to the endpoint
with max_tokens=1 and reports the model's own time to first token beside ours: the overhead we add.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_QUESTIONS = [REPO / "eval/seed_questions.jsonl", REPO / "eval/not_covered_questions.jsonl"]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def ratio(nums: list[float], dens: list[float]) -> dict:
    from rag.evaluation import interval95

    total = sum(dens)
    return {"value": (sum(nums) / total) if total else None, "n": int(total) if all(d in (0, 1) for d in dens) else len(dens),
            "ci95": interval95(nums, dens)}


def fmt(r: dict) -> str:
    if r["value"] is None:
        return "-"
    ci = r["ci95"]
    return f"{r['value']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] (n={r['n']})" if ci else f"{r['value']:.2f}"


def subkind(row: dict) -> str:
    return row.get("subkind") or ("answerable" if row["gold"] else "unanswerable")


def ask_all(rag, rows: list[dict], k: int, use_llm: bool) -> list[dict]:
    from rag import Answer

    records = []
    for row in rows:
        start, first, answer = time.perf_counter(), None, None
        for piece in rag.stream(row["question"], k=k, llm=use_llm):
            if isinstance(piece, Answer):
                answer = piece
            elif piece and first is None:
                first = time.perf_counter() - start
        total = time.perf_counter() - start
        records.append({"row": row, "answer": answer, "ttft": first or total, "total": total})
        sys.stderr.write("a" if answer.abstained else ".")
        sys.stderr.flush()
    sys.stderr.write("\n")
    return records


def direct_ttft(rag, rows: list[dict], k: int) -> list[float]:
    """The endpoint's own time to first token for the prompt we would send (max_tokens=1)."""
    import openai

    from rag.generate import build_messages

    client = openai.OpenAI(base_url=rag.settings.openai_base_url, api_key=rag.settings.openai_api_key or "x")
    times = []
    for row in rows:
        sources = rag.search(row["question"], k=k)
        messages, _ = build_messages(row["question"], sources, rag.settings.llm_context_tokens)
        start = time.perf_counter()
        for chunk in client.chat.completions.create(model=rag.settings.llm_model, messages=messages, stream=True,
                                                    max_tokens=1, temperature=0):
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content is not None:
                break
        times.append(time.perf_counter() - start)
    return times


def summarize(records: list[dict]) -> dict:
    from rag.citations import is_claim, split_sentences
    from rag.evaluation import key_fact_recall

    out: dict = {}
    answered = [r for r in records if not r["answer"].abstained and r["answer"].error is None]
    cits = [(sum(1 for c in r["answer"].citations if c.supported), len(r["answer"].citations)) for r in answered]
    out["citations_supported"] = ratio([a for a, _ in cits], [b for _, b in cits])
    claims = []
    for r in answered:
        sentences = [s for s in split_sentences(r["answer"].answer) if is_claim(s)]
        claims.append((len(sentences) - len(r["answer"].uncited_sentences), len(sentences)))
    out["claims_with_citation"] = ratio([a for a, _ in claims], [b for _, b in claims])
    out["markers_to_no_source"] = sum(len(r["answer"].removed_markers) for r in records)
    out["answers_with_citation"] = ratio([bool(r["answer"].citations) for r in answered], [1] * len(answered))
    unanswerable = [r for r in records if not r["row"]["gold"]]
    abstained = [r for r in records if r["answer"].abstained]
    out["abstention_precision"] = ratio([not r["row"]["gold"] for r in abstained], [1] * len(abstained))
    out["abstention_recall"] = ratio([r["answer"].abstained for r in unanswerable], [1] * len(unanswerable))
    for sub in ("off-topic", "not-covered", "near-miss"):
        group = [r for r in unanswerable if subkind(r["row"]) == sub]
        out[f"recall_{sub}"] = ratio([r["answer"].abstained for r in group], [1] * len(group))
    answerable = [r for r in records if r["row"]["gold"]]
    out["answerable_refused"] = ratio([r["answer"].abstained for r in answerable], [1] * len(answerable))
    facts = [key_fact_recall(r["answer"].answer, r["row"]["key_facts"]) for r in answerable if r["row"].get("key_facts")]
    out["key_fact_recall"] = ratio(facts, [1] * len(facts))
    out["abstained_by"] = dict(Counter(f"{'unanswerable' if not r['row']['gold'] else 'answerable'}/"
                                       f"{r['answer'].abstained_by}" for r in abstained))
    out["errors"] = [r["answer"].error for r in records if r["answer"].error]
    ttft, total = [r["ttft"] for r in records], [r["total"] for r in records]
    llm_ttft = [r["ttft"] for r in records if r["answer"].abstained_by != "retrieval"]
    llm_total = [r["total"] for r in records if r["answer"].abstained_by != "retrieval"]
    out["ttft_p50"], out["ttft_p95"] = pct(ttft, .5), pct(ttft, .95)
    out["total_p50"], out["total_p95"] = pct(total, .5), pct(total, .95)
    out["llm_ttft_p50"], out["llm_total_p50"] = pct(llm_ttft, .5), pct(llm_total, .5)
    out["questions"] = len(records)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, nargs="+", default=DEFAULT_QUESTIONS)
    ap.add_argument("--store", type=Path, help="store directory (default: RAG_STORE_DIR or store/)")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--every", type=int, default=1, help="only every K-th question (a spread sample)")
    ap.add_argument("--heldout", choices=("include", "exclude", "only"), default="include",
                    help="questions marked heldout (kept aside while tuning)")
    ap.add_argument("--no-llm", action="store_true", help="extractive answers")
    ap.add_argument("--direct", action="store_true", help="also time the endpoint alone on the same prompts")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--json", type=Path, help="write the figures and every answer here")
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    args = ap.parse_args()

    from rag import RAG

    rag = RAG(**({"store_dir": args.store} if args.store else {}))
    rows = [json.loads(line) for path in args.questions for line in path.read_text().splitlines() if line.strip()]
    if args.heldout != "include":
        rows = [r for r in rows if bool(r.get("heldout")) == (args.heldout == "only")]
    rows = rows[:: args.every][: args.limit]
    use_llm = not args.no_llm and rag.settings.llm_backend != "none"
    label = f"LLM {rag.llm.label}" if use_llm else "extractive"
    print(f"{len(rows)} questions ({dict(Counter(subkind(r) if not r['gold'] else r['kind'] for r in rows))}); answers: {label}")
    k = args.k or rag.settings.top_k
    records = ask_all(rag, rows, k, use_llm)
    result = summarize(records)
    if args.direct and use_llm and rag.settings.llm_backend == "openai":
        direct = direct_ttft(rag, rows, k)
        ours = [r["ttft"] for r in records]
        result["direct_ttft_p50"] = pct(direct, .5)
        result["ttft_overhead_ratio_p50"] = pct([o / d for o, d in zip(ours, direct) if d > 0], .5)
    for key, value in result.items():
        print(f"{key}: {fmt(value) if isinstance(value, dict) and 'value' in value else value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        answers = [{"id": r["row"]["id"], "kind": r["row"]["kind"], "subkind": r["row"].get("subkind"),
                    "question": r["row"]["question"], "abstained": r["answer"].abstained,
                    "abstained_by": r["answer"].abstained_by, "answer": r["answer"].answer,
                    "grounding": r["answer"].grounding, "citations": [c.model_dump() for c in r["answer"].citations],
                    "cited": [s.paper_id for s in r["answer"].sources if s.cited], "gold": r["row"]["gold"],
                    "ttft": round(r["ttft"], 3), "total": round(r["total"], 3)} for r in records]
        args.json.write_text(json.dumps({"label": args.label or label, "settings": {
            "llm": label, "k": k, "context_tokens": rag.settings.llm_context_tokens,
            "max_tokens": rag.settings.llm_max_tokens}, "figures": result, "answers": answers}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
