"""Answer quality and speed on question sets: what the README's answer table quotes.

    python -m bench.answers.quality --store DIR [--questions FILE ...] [--every K] [--limit N]
[--no-llm] [--direct] [--json OUT] [--label NAME] [--replies R]

Asks every question through `RAG.stream` with the configured LLM (OPENAI_BASE_URL + RAG_LLM_MODEL,
or RAG_LLM=local), or extractively with --no-llm, and prints, with 95% intervals (Wilson for shares
of questions, a seeded bootstrap over questions for other ratios):
- citations marked supported (of all citations), claim sentences that cite a source, markers that
  pointed at no source (removed);
- abstention precision; recall per unanswerable subkind (off-topic, not-covered, near-miss); the
  share of answerable questions refused; which mechanism abstained (retrieval rule, model refusal,
  answerability check);
- key-fact recall on answerable questions;
- time to first character and to the full answer (p50, p95: nearest rank,
  `bench.helpers.percentile`). --direct (OpenAI-compatible endpoints) then sends each question's
  same prompt straight to the endpoint with max_tokens=1 and reports the model's own time to first
  token beside ours (N questions, spread): the overhead we add, the answerability check included.
  --from-json re-reads a saved run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from bench.helpers import REPO, Recorded, percentile, write_json

DEFAULT_QUESTIONS = [REPO / "eval/seed_questions.jsonl", REPO / "eval/not_covered_questions.jsonl"]


def ratio(nums: list[float], dens: list[float]) -> dict:
    from rag.evaluation import interval95

    total = sum(dens)
    return {
        "value": (sum(nums) / total) if total else None,
        "n": int(total) if all(d in (0, 1) for d in dens) else len(dens),
        "ci95": interval95(nums, dens),
    }


def fmt(r: dict) -> str:
    if r["value"] is None:
        return "-"
    ci = r["ci95"]
    return (
        f"{r['value']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] (n={r['n']})" if ci else f"{r['value']:.2f}"
    )


def subkind(row: dict) -> str:
    return row.get("subkind") or ("answerable" if row["gold"] else "unanswerable")


def interleave(rows: list[dict]) -> list[dict]:
    """Kinds taken in turn, so that a run stopped early is still a spread sample."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["kind"] if r["gold"] else subkind(r), []).append(r)
    out, queues = [], [list(g) for g in groups.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def ask_all(rag, rows: list[dict], k: int, use_llm: bool, save=None) -> list[dict]:
    """Every question through `RAG.stream`; `save(records)` after each, so a long run that is
    stopped keeps what it asked."""
    records = []
    for row in rows:
        start, first = time.perf_counter(), None
        stream = rag.stream(row["question"], k=k, llm=use_llm)
        for piece in stream:
            if piece and first is None:
                first = time.perf_counter() - start
        answer = stream.answer
        total = time.perf_counter() - start
        records.append({"row": row, "answer": answer, "ttft": first or total, "total": total})
        sys.stderr.write("a" if answer.abstained else ".")
        sys.stderr.flush()
        if save:
            save(records)
    sys.stderr.write("\n")
    return records


def direct_ttft(rag, rows: list[dict], k: int) -> list[float]:
    """The model's own time to first token for the prompt we would send (max_tokens=1): through the
    endpoint, or straight into llama.cpp for RAG_LLM=local."""
    from rag.answer.free import build_messages

    if rag.settings.llm_backend == "local":

        def first_token(messages):
            rag.llm._llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0)
    else:
        import openai

        client = openai.OpenAI(
            base_url=rag.settings.openai_base_url, api_key=rag.settings.openai_api_key or "x"
        )

        def first_token(messages):
            for chunk in client.chat.completions.create(
                model=rag.settings.llm_model,
                messages=messages,
                stream=True,
                max_tokens=1,
                temperature=0,
            ):
                if (
                    chunk.choices
                    and chunk.choices[0].delta
                    and chunk.choices[0].delta.content is not None
                ):
                    break

    times = []
    for row in rows:
        sources = rag.search(row["question"], k=k)
        messages, _ = build_messages(
            row["question"],
            sources,
            rag.settings.llm_context_tokens,
            rag.settings.llm_source_tokens,
            embed=lambda t: rag.embedder.embed(t, truncate=True),
        )
        start = time.perf_counter()
        first_token(messages)
        times.append(time.perf_counter() - start)
    return times


def cited_ids(record: dict) -> set[str]:
    """The papers an answer cites (from its sources, or as saved)."""
    return {s.paper_id for s in record["answer"].sources if s.cited} or set(record.get("cited", []))


def summarize(records: list[dict]) -> dict:
    from rag.answer.citations import is_claim, split_sentences
    from rag.evaluation import key_fact_recall

    out: dict = {}
    answered = [r for r in records if not r["answer"].abstained and r["answer"].error is None]
    cits = [
        (sum(1 for c in r["answer"].citations if c.supported), len(r["answer"].citations))
        for r in answered
    ]
    out["citations_supported"] = ratio([a for a, _ in cits], [b for _, b in cits])
    claims = []
    for r in answered:
        sentences = [s for s in split_sentences(r["answer"].answer) if is_claim(s)]
        claims.append((len(sentences) - len(r["answer"].uncited_sentences), len(sentences)))
    out["claims_with_citation"] = ratio([a for a, _ in claims], [b for _, b in claims])
    out["markers_to_no_source"] = sum(len(r["answer"].removed_markers) for r in records)
    out["answers_with_citation"] = ratio(
        [bool(r["answer"].citations) for r in answered], [1] * len(answered)
    )
    unanswerable = [r for r in records if not r["row"]["gold"]]
    abstained = [r for r in records if r["answer"].abstained]
    out["abstention_precision"] = ratio(
        [not r["row"]["gold"] for r in abstained], [1] * len(abstained)
    )
    out["abstention_recall"] = ratio(
        [r["answer"].abstained for r in unanswerable], [1] * len(unanswerable)
    )
    for sub in ("off-topic", "not-covered", "near-miss"):
        group = [r for r in unanswerable if subkind(r["row"]) == sub]
        out[f"recall_{sub}"] = ratio([r["answer"].abstained for r in group], [1] * len(group))
    answerable = [r for r in records if r["row"]["gold"]]
    out["answerable_refused"] = ratio(
        [r["answer"].abstained for r in answerable], [1] * len(answerable)
    )
    facts = [
        key_fact_recall(r["answer"].answer, r["row"]["key_facts"])
        for r in answerable
        if r["row"].get("key_facts")
    ]
    out["key_fact_recall"] = ratio(facts, [1] * len(facts))
    # The outcome figures: answered (not refused, not "not stated") per answerable kind, the gold
    # paper among the citations of answered questions, and for unanswerable ones whether the answer
    # held back.
    for kind in ("keyword", "paraphrase", "numeric", "multi"):
        group = [r for r in answerable if r["row"]["kind"] == kind]
        out[f"answered_{kind}"] = ratio(
            [r["answer"].outcome == "answered" for r in group], [1] * len(group)
        )
    out["answered_all"] = ratio(
        [r["answer"].outcome == "answered" for r in answerable], [1] * len(answerable)
    )
    done = [r for r in answerable if r["answer"].outcome == "answered"]
    out["gold_cited_when_answered"] = ratio(
        [bool(set(r["row"]["gold"]) & cited_ids(r)) for r in done], [1] * len(done)
    )
    done_facts = [
        key_fact_recall(r["answer"].answer, r["row"]["key_facts"])
        for r in done
        if r["row"].get("key_facts")
    ]
    out["key_fact_recall_when_answered"] = ratio(done_facts, [1] * len(done_facts))
    for sub in ("off-topic", "not-covered", "near-miss"):
        group = [r for r in unanswerable if subkind(r["row"]) == sub]
        out[f"held_back_{sub}"] = ratio(
            [r["answer"].outcome != "answered" for r in group], [1] * len(group)
        )
    near = [r for r in unanswerable if subkind(r["row"]) == "near-miss"]
    out["near_miss_not_stated"] = ratio(
        [r["answer"].outcome == "not_stated" for r in near], [1] * len(near)
    )
    out["near_miss_all_citations_supported"] = ratio(
        [
            r["answer"].outcome != "answered" or all(c.supported for c in r["answer"].citations)
            for r in near
        ],
        [1] * len(near),
    )
    out["outcomes"] = dict(
        Counter(
            f"{'answerable' if r['row']['gold'] else subkind(r['row'])}/{r['answer'].outcome}"
            for r in records
        )
    )
    out["abstained_by"] = dict(
        Counter(
            f"{'unanswerable' if not r['row']['gold'] else 'answerable'}/{r['answer'].abstained_by}"
            for r in abstained
        )
    )
    out["errors"] = [r["answer"].error for r in records if r["answer"].error]
    ttft, total = [r["ttft"] for r in records], [r["total"] for r in records]
    llm_ttft = [r["ttft"] for r in records if r["answer"].abstained_by != "retrieval"]
    llm_total = [r["total"] for r in records if r["answer"].abstained_by != "retrieval"]
    out["ttft_p50"], out["ttft_p95"] = percentile(ttft, 50), percentile(ttft, 95)
    out["total_p50"], out["total_p95"] = percentile(total, 50), percentile(total, 95)
    out["llm_ttft_p50"], out["llm_total_p50"] = percentile(llm_ttft, 50), percentile(llm_total, 50)
    out["questions"] = len(records)
    return out


def simulate(records: list[dict], extra) -> dict:
    """Abstention figures had the engine also abstained wherever `extra(answer)` holds."""

    def abstains(r):
        return r["answer"].abstained or extra(r["answer"])

    unanswerable = [r for r in records if not r["row"]["gold"]]
    answerable = [r for r in records if r["row"]["gold"]]
    out = {
        "precision": ratio(
            [not r["row"]["gold"] for r in records if abstains(r)],
            [1] * sum(map(abstains, records)),
        )
    }
    for sub in ("not-covered", "near-miss"):
        group = [r for r in unanswerable if subkind(r["row"]) == sub]
        out[f"recall_{sub}"] = ratio([abstains(r) for r in group], [1] * len(group))
    out["answerable_refused"] = ratio([abstains(r) for r in answerable], [1] * len(answerable))
    return {k: fmt(v) for k, v in out.items()}


def check_below(threshold: float):
    """The answerability check refusing below `threshold`."""
    return lambda a: a.answerable is not None and a.answerable < threshold


def unsupported(a) -> bool:
    """The support check refusing an answer none of whose claims its sources support."""
    return not a.abstained and a.error is None and not any(c.supported for c in a.citations)


def saved_answer(r: dict) -> dict:
    a, row = r["answer"], r["row"]
    return {
        "id": row["id"],
        "kind": row["kind"],
        "subkind": row.get("subkind"),
        "question": row["question"],
        "gold": row["gold"],
        "key_facts": row.get("key_facts"),
        "mode": a.mode,
        "outcome": a.outcome,
        "abstained": a.abstained,
        "abstained_by": a.abstained_by,
        "answerable": a.answerable,
        "answer": a.answer,
        "grounding": a.grounding,
        "citations": [c.model_dump() for c in a.citations],
        "cited": [s.paper_id for s in a.sources if s.cited],
        "uncited_sentences": a.uncited_sentences,
        "removed_markers": a.removed_markers,
        "error": a.error,
        "ttft": round(r["ttft"], 3),
        "total": round(r["total"], 3),
    }


def report_saved(args) -> int:
    """Figures of a saved run (its answers re-read as `Answer`s): thresholds can be tried without
    asking again."""
    from rag import Answer
    from rag.models import Citation

    saved = json.loads(args.from_json.read_text())
    held = {
        r["id"]: bool(r.get("heldout"))
        for path in args.questions
        for line in path.read_text().splitlines()
        if line.strip()
        for r in [json.loads(line)]
    }
    records = []
    for a in saved["answers"]:
        if args.heldout != "include" and held.get(a["id"], False) != (args.heldout == "only"):
            continue
        answer = Answer(
            question=a["question"],
            answer=a["answer"],
            mode=a.get("mode", "llm"),
            abstained=a["abstained"],
            outcome=a.get("outcome", "not_covered" if a["abstained"] else "answered"),
            abstained_by=a["abstained_by"],
            answerable=a.get("answerable"),
            grounding=a["grounding"],
            citations=[Citation(**c) for c in a["citations"]],
            error=a.get("error"),
            uncited_sentences=a.get("uncited_sentences", []),
            removed_markers=a.get("removed_markers", []),
        )
        row = {
            "id": a["id"],
            "kind": a["kind"],
            "subkind": a.get("subkind"),
            "gold": a["gold"],
            "key_facts": a.get("key_facts"),
            "question": a["question"],
        }
        records.append(
            {
                "row": row,
                "answer": answer,
                "ttft": a["ttft"],
                "total": a["total"],
                "cited": a.get("cited", []),
            }
        )
    print(f"{saved['label']}: {len(records)} answers from {args.from_json}")
    print_figures(figures(records, args, use_llm=saved["settings"]["llm"] != "extractive"))
    return 0


def as_shipped(records: list[dict], threshold: float) -> list[dict]:
    """The records as the default engine would have answered: the check refusing below `threshold`,
    then answers with no supported citation withdrawn (from a run with both off)."""
    from rag.prompts import ABSTAIN_ANSWER

    out = []
    for r in records:
        a = r["answer"]
        by = "check" if check_below(threshold)(a) else "support" if unsupported(a) else None
        if by and not a.abstained:
            a = a.model_copy(
                update={
                    "abstained": True,
                    "abstained_by": by,
                    "citations": [],
                    "uncited_sentences": [],
                    "answer": ABSTAIN_ANSWER,
                }
            )
        out.append({**r, "answer": a})
    return out


def figures(records: list[dict], args, use_llm: bool) -> dict:
    result = summarize(records)
    if args.as_shipped is not None:
        result["as_shipped"] = {
            k: v
            for k, v in summarize(as_shipped(records, args.as_shipped)).items()
            if not k.startswith(("ttft", "total", "llm_"))
        }
    if use_llm:
        result["plus_support_rule"] = simulate(records, unsupported)
    for t in [float(x) for x in args.check_thresholds.split(",") if x]:
        result[f"check_at_{t:g}"] = simulate(records, check_below(t))
        result[f"check_at_{t:g}_plus_support_rule"] = simulate(
            records, lambda a, t=t: check_below(t)(a) or unsupported(a)
        )
    return result


def print_figures(result: dict, indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict) and "value" not in value and key == "as_shipped":
            print(f"{indent}{key}:")
            print_figures(value, indent + "    ")
        else:
            print(
                f"{indent}{key}:"
                f" {fmt(value) if isinstance(value, dict) and 'value' in value else value}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--questions", type=Path, nargs="+", default=DEFAULT_QUESTIONS)
    ap.add_argument("--store", type=Path, help="store directory (default: RAG_STORE_DIR or store/)")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument(
        "--every", type=int, default=1, help="only every K-th question (a spread sample)"
    )
    ap.add_argument(
        "--subkind-every",
        default="",
        metavar="S=K,...",
        help="of the unanswerable questions of subkind S, every K-th only (e.g. near-miss=2)",
    )
    ap.add_argument(
        "--answerable-every",
        type=int,
        default=1,
        help="of the answerable questions, every K-th only",
    )
    ap.add_argument(
        "--check-thresholds",
        default="",
        help=(
            "with RAG_LLM_CHECK=true and RAG_LLM_CHECK_THRESHOLD=0: abstention figures had the"
            " check refused below each of these thresholds (comma-separated), from the same answers"
        ),
    )
    ap.add_argument(
        "--not-covered-from",
        type=Path,
        help=(
            "take not-covered questions only from this file (those verified absent from this store,"
            " e.g. eval/icml2026_unanswerable.jsonl for the 5.9k-paper setting)"
        ),
    )
    ap.add_argument(
        "--as-shipped",
        type=float,
        metavar="T",
        help=(
            "from a run with RAG_LLM_CHECK_THRESHOLD=0 and RAG_LLM_REQUIRE_SUPPORT=false: every"
            " figure as the default engine (check threshold T, unsupported answers withdrawn) would"
            " give it"
        ),
    )
    ap.add_argument(
        "--heldout",
        choices=("include", "exclude", "only"),
        default="include",
        help="questions marked heldout (kept aside while tuning)",
    )
    ap.add_argument("--no-llm", action="store_true", help="extractive answers")
    ap.add_argument(
        "--direct",
        type=int,
        default=0,
        metavar="N",
        help="also time the endpoint alone on the same prompts, for N questions the LLM answered",
    )
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--json", type=Path, help="write the figures and every answer here")
    ap.add_argument(
        "--replies",
        type=Path,
        help="keep the model's replies here, reuse those kept (a rule"
        " judged again on the same replies: RAG_RULES_OFF=NAME)",
    )
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument(
        "--from-json", type=Path, help="recompute the figures from a run's --json instead of asking"
    )
    args = ap.parse_args()

    if args.from_json:
        return report_saved(args)

    from rag import RAG

    rag = RAG(**({"store_dir": args.store} if args.store else {}))
    if args.replies and rag.has_llm and not args.no_llm:
        rag = RAG(rag.settings, embedder=rag.embedder, llm=Recorded(rag.llm, args.replies))
    rows = [
        json.loads(line)
        for path in args.questions
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    if args.not_covered_from:
        rows = [r for r in rows if subkind(r) != "not-covered"] + [
            json.loads(line)
            for line in args.not_covered_from.read_text().splitlines()
            if line.strip()
        ]
    if args.heldout != "include":
        rows = [r for r in rows if bool(r.get("heldout")) == (args.heldout == "only")]
    rows = [r for i, r in enumerate(rows) if not r["gold"] or i % args.answerable_every == 0]
    every = {k: int(v) for k, v in (x.split("=") for x in args.subkind_every.split(",") if x)}
    seen: Counter = Counter()
    keep = []
    for r in rows:
        sub = subkind(r)
        if r["gold"] or seen[sub] % every.get(sub, 1) == 0:
            keep.append(r)
        seen[sub] += 1
    rows = interleave(keep)[:: args.every][: args.limit]
    use_llm = not args.no_llm and rag.settings.llm_backend != "none"
    label = f"LLM {rag.llm.label}" if use_llm else "extractive"
    print(
        f"{len(rows)} questions"
        f" ({dict(Counter(subkind(r) if not r['gold'] else r['kind'] for r in rows))}); answers:"
        f" {label}"
    )
    k = args.k or rag.settings.top_k
    settings = {
        "llm": label,
        "k": k,
        "context_tokens": rag.settings.llm_context_tokens,
        "source_tokens": rag.settings.llm_source_tokens,
        "check": rag.settings.llm_check,
        "answer_style": rag.settings.answer_style,
        "top_source_tokens": rag.settings.llm_top_source_tokens,
        "max_tokens": rag.settings.llm_max_tokens,
    }

    def save(records: list[dict], result: dict | None = None) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            write_json(
                args.json,
                {
                    "label": args.label or label,
                    "settings": settings,
                    "figures": result or {},
                    "answers": [saved_answer(r) for r in records],
                },
                indent=1,
            )

    records = ask_all(rag, rows, k, use_llm, save)
    result = figures(records, args, use_llm)
    if args.direct and use_llm:
        timed = [r for r in records if r["answer"].abstained_by != "retrieval"]
        timed = timed[:: max(1, len(timed) // args.direct)][: args.direct]
        direct = direct_ttft(rag, [r["row"] for r in timed], k)
        ours = [r["ttft"] for r in timed]
        result["direct_ttft_p50"] = percentile(direct, 50)
        result["ours_ttft_p50_same_questions"] = percentile(ours, 50)
        result["ttft_overhead_ratio_p50"] = percentile(
            [o / d for o, d in zip(ours, direct) if d > 0], 50
        )
    print_figures(result)
    save(records, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
