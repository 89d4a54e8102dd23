"""The answer rules and the text functions on untrusted text, fed 100,000-character pathological
inputs (runs of one short pattern that make a backtracking regex quadratic): the CPU seconds of the
worst input per function, beside the same function on an ordinary abstract of the same length.

    python -m bench.hardening.pathological [--only NAME] [--limit SECONDS]

tests/test_bounded.py asserts a loose bound on the same table (`CASES`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bench.helpers import machine_load

N = 100_000
# Units repeated to N characters: each makes some pattern of rag/ scan a long run from every start.
UNITS = [
    "a-",
    "Ab1+",
    "(Ab ",
    "<script ",
    "a",
    " ",
    "A",
    "1.",
    "a.",
    "A ",
    "aA",
    "-",
    "a ",
    "Ab ",
    "AB-",
    "a, ",
    "[1]",
    "[",
    "http://a",
    "a/",
    "\u200b",
    "``",
    "'",
    '"a',
    "a1",
    "e.g. ",
    "(",
    "a(",
    "a=",
    "**",
    "_a",
    "\\text{",
    "$",
    "$1",
    "{",
    "  \n",
    "[a](",
    "![",
    "Answer: ",
    "(a) ",
]
ORDINARY = (
    "We propose Palimpsa, a self-attention model that views in-context learning as a continual"
    " learning problem (ICL) with a stability-plasticity dilemma, and evaluate it on 12 benchmarks"
    " [1]. "
)
REPLY = 4_000  # characters of a model's reply
NAMES_QUESTION = "Which models win on hyphen storm benchmarks?"
QUESTION = "Which models win on hyphen storm benchmarks, and how many (HSB) were used?"


def inputs() -> dict[str, str]:
    return {repr(u): (u * (N // len(u) + 1))[:N] for u in UNITS}


def _cases() -> dict[str, Callable[[str], object]]:
    """Each function that reads untrusted text (an abstract, a title, a model's reply), called on
    `text`; the question is the ordinary one (questions are capped at 2,000 characters)."""
    from rag.answer import citations, evidence, extractive, injection
    from rag.answer.rules import answer_type, injection_output, support, topic
    from rag.index.keyword import name_like_words
    from rag.latex import plain_prose, to_html, to_text
    from rag.models import Source

    def source(text: str) -> Source:
        return Source(n=1, paper_id="p", title="T", score=0.5, passage=text)

    def reply(text: str) -> str:
        parser = evidence.ReplyParser(1, [evidence.ShownSource(1, "T", ["A sentence."])])
        return parser.feed(text) + parser.close()

    return {
        "answer_type.gives_asked_type": lambda t: answer_type.gives_asked_type(QUESTION, t, [t]),
        "answer_type.unwritten_names": lambda t: answer_type.unwritten_names(QUESTION, [t]),
        # The round-four finding: a names question over an abstract that is one long hyphenated run.
        "answer_type.names_question": lambda t: answer_type.gives_asked_type(
            NAMES_QUESTION, NAMES_QUESTION, [NAMES_QUESTION + " " + t]
        ),
        "answer_type.from_another_paper": lambda t: answer_type.from_another_paper(
            QUESTION, [(1, t)], {1: 1.0}, [t]
        ),
        "topic.absent_topic": lambda t: topic.absent_topic(QUESTION, [t]),
        "topic.missing_names": lambda t: topic.missing_names(QUESTION, [t]),
        "support.grafted_words": lambda t: support.grafted_words(t, t, QUESTION),
        "support.swapped_names": lambda t: support.swapped_names(t[:2000], t),
        "support.without_copies": lambda t: support.without_copies(t, [t]),
        "support.copies_example": lambda t: support.copies_example(t, t),
        "injection.sanitize": lambda t: injection.sanitize(t),
        "injection.sanitize(title)": lambda t: injection.sanitize(t, title=True),
        "injection.instruction_sentences": lambda t: injection.instruction_sentences(t),
        "injection.risky_tokens": lambda t: injection.risky_tokens(t),
        "injection_output.clean_answer": lambda t: injection_output.clean_answer(
            t, t, [], [], QUESTION
        ),
        "citations.split_sentences": lambda t: citations.split_sentences(t),
        # The answer is a model's reply (its length capped by the tokens it may write): a few
        # thousand characters, checked against a whole abstract.
        "citations.check_support": lambda t: citations.check_support(t[:REPLY], [source(t)]),
        "citations.MarkerRewriter": lambda t: citations.MarkerRewriter(1).feed(t),
        "evidence.source_sentences": lambda t: evidence.source_sentences(t),
        "evidence.ReplyParser": reply,
        "extractive.BOILERPLATE": lambda t: extractive.BOILERPLATE.search(t),
        "keyword.name_like_words": lambda t: name_like_words(t),
        "latex.to_text": lambda t: to_text(t),
        "latex.to_html": lambda t: to_html(t),
        "latex.plain_prose": lambda t: plain_prose(t),
    }


CASES = _cases


def cpu(fn: Callable[[str], object], text: str) -> float:
    start = time.process_time()
    fn(text)
    return time.process_time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="functions of the table, by name")
    args = ap.parse_args()
    print(f"machine: {machine_load()}")
    ordinary = (ORDINARY * (N // len(ORDINARY) + 1))[:N]
    print(f"{'function':36} {'ordinary s':>10} {'worst s':>8}  worst input")
    for name, fn in CASES().items():
        if args.only and name not in args.only:
            continue
        base = cpu(fn, ordinary)
        worst = max((cpu(fn, text), unit) for unit, text in inputs().items())
        print(f"{name:36} {base:10.3f} {worst[0]:8.3f}  {worst[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
