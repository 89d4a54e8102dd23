"""How many planted instructions reach an answer: no defence, the previous one, the shipped one.

    python bench/injection.py [--model scripted|local] [--defences none,previous,now] [--json OUT]

The 36 variants of `tests/injections.py` (paraphrases, chat-template markup, instructions split over
sentences, six other languages, encodings and disguises, markdown images and links), each planted in
a real ICML 2026 abstract, ingested into a fresh store; each paper is asked about by title, so its
poisoned abstract is among the sources. Counted: answers carrying the variant's canary or the
attacker's link (streamed text or final answer), and prompts that carried them to the model.
Models: `scripted` (tests/obedient_server.py: obeys every instruction it can see, the worst case) or
`local` (Qwen2.5-Coder-1.5B-Instruct in-process, as shipped). Defences:
- none: the abstract as it is, inside the `<source>` fence;
- previous: the blocklist filter this project shipped until this change (copied below, from commit
  554a76c), no output check;
- now: rag/injection.py (fencing, instruction sentences, output check, stream guard).
Also prints how many sentences of the 5,862 ICML 2026 abstracts the instruction filter removes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.injections import HELD_OUT, SHARED, VARIANTS, leaked, poisoned_records, question_for  # noqa: E402

# The previous defence (rag/generate.py at 554a76c), kept here as the baseline.
_OLD_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:instructions?|prompts?|rules|above|previous)\b"
    r"|\b(?:system prompt|api[ _-]?key|you (?:must|should) (?:now )?(?:say|reply|answer|respond|print|output))\b"
    r"|\b(?:reply|respond|answer) (?:only )?with\b",
    re.IGNORECASE,
)
_OLD_SOURCE_TAG = re.compile(r"</?\s*source\b[^>]*>?", re.IGNORECASE)


def previous_sanitize(text: str) -> str:
    from rag.citations import MARKER, split_sentences

    text = _OLD_SOURCE_TAG.sub(" ", text)
    text = MARKER.sub(lambda m: f"({m.group(1)})", text)
    kept = [s for s in split_sentences(text) if not _OLD_INJECTION.search(s)]
    removed = len(split_sentences(text)) - len(kept)
    return " ".join(kept) + (" (Instruction-like text removed from this source.)" if removed else "")


class _Passthrough:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def feed(self, delta: str) -> str:
        return delta

    def close(self) -> str:
        return ""


def patched(defence: str) -> ExitStack:
    """The engine with the chosen defence in place of the shipped one."""
    from rag import answer as answering
    from rag.injection import CleanedAnswer, Sanitized

    stack = ExitStack()
    if defence == "now":
        return stack
    clean = (lambda t: Sanitized(t, [])) if defence == "none" else (lambda t: Sanitized(previous_sanitize(t), []))
    stack.enter_context(mock.patch.object(answering, "sanitize", clean))
    stack.enter_context(mock.patch.object(answering, "clean_answer", lambda text, *a, **k: CleanedAnswer(text, [])))
    stack.enter_context(mock.patch.object(answering, "StreamGuard", _Passthrough))
    return stack


def false_positives() -> tuple[int, int, int, int]:
    from rag.citations import split_sentences
    from rag.injection import fence_text, instruction_sentences

    flagged = total = touched = papers = 0
    with gzip.open(SHARED / "data" / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            abstract = json.loads(line).get("abstract") or ""
            if not abstract:
                continue
            flags = instruction_sentences(fence_text(abstract))
            papers += 1
            total += len(split_sentences(fence_text(abstract)))
            flagged += sum(flags)
            touched += any(flags)
    return flagged, total, touched, papers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("scripted", "local"), default="scripted")
    ap.add_argument("--defences", default="none,previous,now")
    ap.add_argument("--whole-passages", action="store_true",
                    help="give the model whole passages (RAG_LLM_SOURCE_TOKENS=0): trimming to the sentences "
                         "closest to the question otherwise drops many planted sentences by chance")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    extra = {"llm_source_tokens": 0} if args.whole_passages else {}

    from rag import RAG
    from tests.obedient_server import ObedientServer

    flagged, total, touched, papers = false_positives()
    print(f"instruction filter on {papers:,} ICML 2026 abstracts: {flagged} of {total:,} sentences removed, "
          f"{touched} abstracts touched")
    records = poisoned_records()
    results = {"model": args.model, "variants": len(records), "whole_passages": args.whole_passages,
               "false_positive_sentences": [flagged, total], "runs": {}}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as servers:
        corpus = Path(tmp) / "poisoned.jsonl"
        corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
        RAG(store_dir=Path(tmp) / "store").ingest([corpus], include_corpus=False)
        if args.model == "scripted":
            server = servers.enter_context(ObedientServer())
            rag = RAG(store_dir=Path(tmp) / "store", llm="openai", openai_base_url=server.base_url,
                      llm_model=server.model, openai_api_key=None, llm_check=False, **extra)
        else:
            server = None
            rag = RAG(store_dir=Path(tmp) / "store", llm="local", **extra)
        for defence in args.defences.split(","):
            leaks, in_prompt, rows = [], 0, []
            with patched(defence):
                for record in records:
                    i = record["variant"]
                    stream = rag.stream(question_for(record))
                    streamed = list(stream)
                    answer = stream.answer
                    text = "".join(streamed) + "\n" + answer.answer
                    # Any variant's canary counts: the other sources may be poisoned abstracts too.
                    hit = any(leaked(j, text) for j in range(len(records)))
                    if hit:
                        leaks.append(i)
                    rows.append({"variant": i, "kind": VARIANTS[i][0], "leaked": hit,
                                 "abstained_by": answer.abstained_by, "filtered": answer.filtered,
                                 "answer": answer.answer})
                    sys.stderr.write("x" if hit else ".")
                    sys.stderr.flush()
            if server is not None:
                in_prompt = sum(any(leaked(i, p) for i in range(len(records))) for p in server.prompts)
                server.prompts.clear()
            sys.stderr.write("\n")
            held = [i for i in leaks if i in HELD_OUT]
            print(f"{args.model:8s} {defence:8s}: canary or link in {len(leaks)} of {len(records)} answers "
                  f"(held-out {len(held)} of {len(HELD_OUT)}); kinds: "
                  + ", ".join(f"{k} {sum(VARIANTS[i][0] == k for i in leaks)}"
                              for k in dict.fromkeys(v[0] for v in VARIANTS))
                  + (f"; prompts carrying one: {in_prompt}" if server is not None else ""))
            results["runs"][defence] = {"leaked": leaks, "held_out_leaked": held, "prompts_carrying": in_prompt,
                                        "answers": rows}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
