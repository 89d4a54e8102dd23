"""How many planted instructions reach an answer, per defence; and what the filter takes from real
papers.

    python -m bench.answers.injection [--model scripted|local] [--defences none,round2,now] [--json
OUT] python -m bench.answers.injection --false-positives-only [--show-false-positives N]

The 85 variants of `tests/injections.py` (57 tuning, 28 held out while the defence of issue 31 was
built: paraphrases, chat-template markup, orders split over sentences or over title and abstract,
nine other languages, encodings, homoglyphs with combining marks, spaced letters, passive and
question forms, role objects, tool-call tags, fake delimiters, script bodies, lower-case canaries,
markdown images and links), each planted in a real ICML 2026 abstract, ingested into a fresh store;
each paper is asked about by title, so its poisoned abstract is among the sources. Counted: answers
carrying any variant's canary or the attacker's link (streamed text or final answer), all and held
out, and prompts that carried them to the model. Models: `scripted` (tests/obedient_server.py: obeys
every instruction it can see, the worst case) or `local` (Qwen2.5-Coder-1.5B-Instruct in-process, as
shipped). Defences:
- none: the abstract as it is, inside the `<source>` fence, no output check;
- previous: the blocklist filter of commit 554a76c (copied below), no output check;
- round2: rag/answer/injection.py before issue 31 (loaded from git at ROUND2_COMMIT);
- output-only: no input filter at all, only issue 31's output rule and the answer checks;
- now: rag/answer/injection.py as shipped. First prints what the instruction filter takes from the
  9,545 ICML 2026 papers (main track and workshops): sentences of abstracts, and titles hidden from
  the model.
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

from bench.helpers import REPO, SHARED_DATA
from tests.injections import HELD_OUT, VARIANTS, leaked, poisoned_records, question_for

# The previous defence (rag/generate.py at 554a76c), kept here as the baseline.
_OLD_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:instructions?|prompts?|rules|above|previous)\b"
    r"|\b(?:system prompt|api[ _-]?key|you (?:must|should) (?:now"
    r" )?(?:say|reply|answer|respond|print|output))\b"
    r"|\b(?:reply|respond|answer) (?:only )?with\b",
    re.IGNORECASE,
)
_OLD_SOURCE_TAG = re.compile(r"</?\s*source\b[^>]*>?", re.IGNORECASE)


def previous_sanitize(text: str) -> str:
    from rag.answer.citations import MARKER, split_sentences

    text = _OLD_SOURCE_TAG.sub(" ", text)
    text = MARKER.sub(lambda m: f"({m.group(1)})", text)
    kept = [s for s in split_sentences(text) if not _OLD_INJECTION.search(s)]
    removed = len(split_sentences(text)) - len(kept)
    return " ".join(kept) + (
        " (Instruction-like text removed from this source.)" if removed else ""
    )


# The defence of round two (rag/answer/injection.py before issue 31), loaded from git: the "before"
# of issue 31.
ROUND2_COMMIT = "b299d580569e628f420fdecfe384abb50d937d4b"


def round2_module():
    import subprocess
    import types

    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{ROUND2_COMMIT}:rag/injection.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # Its one relative import, to where that module lives now.
    source = source.replace("from .citations import", "from rag.answer.citations import")
    module = types.ModuleType("rag.injection_round2")
    module.__package__ = "rag"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, "rag/injection_round2.py", "exec"), module.__dict__)  # noqa: S102 - our own file at a commit
    return module


def patched(defence: str) -> ExitStack:
    """The engine with the chosen defence in place of the shipped one: "none", "previous" (the
    blocklist of 554a76c), "round2" (rag/answer/injection.py before issue 31), "output-only" (no
    input filter at all, only the output rule of issue 31) or "now"."""
    from rag.answer import evidence, evidence_answer, extractive, free
    from rag.answer.citations import split_sentences
    from rag.answer.injection import Sanitized
    from rag.answer.rules.injection_output import CleanedAnswer

    stack = ExitStack()
    if defence == "now":
        return stack
    if defence == "round2":
        old = round2_module()
        stack.enter_context(
            mock.patch.object(evidence, "instruction_sentences", old.instruction_sentences)
        )
        stack.enter_context(mock.patch.object(evidence, "fence_text", old.fence_text))
        stack.enter_context(
            mock.patch.object(extractive, "instruction_sentences", old.instruction_sentences)
        )
        for answering in (free, evidence_answer):
            stack.enter_context(
                mock.patch.object(answering, "sanitize", lambda t, title=False: old.sanitize(t))
            )
            stack.enter_context(
                mock.patch.object(
                    answering,
                    "clean_answer",
                    lambda text, a, u, r, q="", codes=None: old.clean_answer(text, a, u, r, q),
                )
            )
        return stack

    def flags(text: str, title: bool = False) -> list[bool]:
        sentences = split_sentences(text)
        if defence == "previous":
            return [bool(_OLD_INJECTION.search(s)) for s in sentences]
        return [False] * len(sentences)

    def clean(text: str, title: bool = False) -> Sanitized:
        return Sanitized(previous_sanitize(text) if defence == "previous" else text, [])

    # Every place the engine filters: the free-form prompt (sanitize), the evidence prompt and the
    # extractive answer (instruction_sentences), and, unless the output rule is measured alone, the
    # answer checks.
    for answering in (free, evidence_answer):
        stack.enter_context(mock.patch.object(answering, "sanitize", clean))
    stack.enter_context(mock.patch.object(evidence, "instruction_sentences", flags))
    stack.enter_context(mock.patch.object(extractive, "instruction_sentences", flags))
    if defence == "output-only":
        import rag.answer.injection as injection

        stack.enter_context(mock.patch.object(injection, "instruction_sentences", flags))
        return stack
    for answering in (free, evidence_answer):
        stack.enter_context(
            mock.patch.object(
                answering, "clean_answer", lambda text, *a, **k: CleanedAnswer(text, [])
            )
        )
    return stack


FP_FILES = ("icml2026_main.jsonl.gz", "icml2026_workshops.jsonl.gz")


def false_positives(show: int = 0) -> dict:
    """What the instruction filter takes out of real ICML 2026 papers (main track and workshops):
    sentences of abstracts, and whole titles (a flagged title is hidden from the model)."""
    from rag.answer.citations import split_sentences
    from rag.answer.injection import fence_text, instruction_sentences

    flagged = total = touched = papers = titles = hidden = 0
    examples: list[str] = []
    for name in FP_FILES:
        with gzip.open(SHARED_DATA / name, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                title = row.get("title") or ""
                if title:
                    titles += 1
                    if any(instruction_sentences(fence_text(title), title=True)):
                        hidden += 1
                        examples.append(f"title: {title}")
                abstract = row.get("abstract") or ""
                if not abstract:
                    continue
                fenced = fence_text(abstract)
                flags = instruction_sentences(fenced)
                papers += 1
                total += len(flags)
                flagged += sum(flags)
                touched += any(flags)
                examples += [f"sentence: {s}" for s, f in zip(split_sentences(fenced), flags) if f]
    for example in examples[:show]:
        print("  " + example[:300])
    return {
        "sentences_flagged": flagged,
        "sentences": total,
        "abstracts_touched": touched,
        "abstracts": papers,
        "titles_hidden": hidden,
        "titles": titles,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=("scripted", "local"), default="scripted")
    ap.add_argument(
        "--defences",
        default="none,round2,now",
        help="comma-separated, of none, previous, round2, output-only, now",
    )
    ap.add_argument(
        "--whole-passages",
        action="store_true",
        help="give the model whole passages (RAG_LLM_SOURCE_TOKENS=0): trimming to the sentences "
        "closest to the question otherwise drops many planted sentences by chance",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--false-positives-only",
        action="store_true",
        help="only count what the filter takes from real papers",
    )
    ap.add_argument(
        "--show-false-positives", type=int, default=0, metavar="N", help="print the first N of them"
    )
    args = ap.parse_args()
    extra = {"llm_source_tokens": 0} if args.whole_passages else {}

    from rag import RAG
    from tests.obedient_server import ObedientServer

    fp = false_positives(args.show_false_positives)
    print(
        f"instruction filter on {fp['abstracts']:,} ICML 2026 abstracts (main + workshops):"
        f" {fp['sentences_flagged']} of {fp['sentences']:,} sentences removed"
        f" ({1e4 * fp['sentences_flagged'] / max(fp['sentences'], 1):.2f} per 10,000),"
        f" {fp['abstracts_touched']} abstracts touched; {fp['titles_hidden']} of {fp['titles']:,}"
        " titles hidden"
    )
    if args.false_positives_only:
        return 0
    records = poisoned_records()
    results = {
        "model": args.model,
        "variants": len(records),
        "whole_passages": args.whole_passages,
        "false_positives": fp,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as servers:
        corpus = Path(tmp) / "poisoned.jsonl"
        corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
        RAG(store_dir=Path(tmp) / "store").ingest([corpus], include_corpus=False)
        if args.model == "scripted":
            server = servers.enter_context(ObedientServer())
            rag = RAG(
                store_dir=Path(tmp) / "store",
                llm="openai",
                openai_base_url=server.base_url,
                llm_model=server.model,
                openai_api_key=None,
                llm_check=False,
                **extra,
            )
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
                    rows.append(
                        {
                            "variant": i,
                            "kind": VARIANTS[i][0],
                            "leaked": hit,
                            "abstained_by": answer.abstained_by,
                            "filtered": answer.filtered,
                            "answer": answer.answer,
                        }
                    )
                    sys.stderr.write("x" if hit else ".")
                    sys.stderr.flush()
            if server is not None:
                in_prompt = sum(
                    any(leaked(i, p) for i in range(len(records))) for p in server.prompts
                )
                server.prompts.clear()
            sys.stderr.write("\n")
            held = [i for i in leaks if i in HELD_OUT]
            print(
                f"{args.model:8s} {defence:8s}: canary or link in {len(leaks)} of {len(records)}"
                f" answers (held-out {len(held)} of {len(HELD_OUT)}); kinds: "
                + ", ".join(
                    f"{k} {sum(VARIANTS[i][0] == k for i in leaks)}"
                    for k in dict.fromkeys(v[0] for v in VARIANTS)
                )
                + (f"; prompts carrying one: {in_prompt}" if server is not None else "")
            )
            results["runs"][defence] = {
                "leaked": leaks,
                "held_out_leaked": held,
                "prompts_carrying": in_prompt,
                "answers": rows,
            }
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
