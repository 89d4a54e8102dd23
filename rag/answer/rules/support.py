"""The support rules of evidence answers (rag/answer/rules/__init__.py): each sentence of the
model's synthesis is checked against what it cites, whole and clause by clause, for words grafted
from the question, a swapped name, a copy of the worked example and the refusal phrase; a sentence
failing one is dropped (the quotes stay). And a sentence that only repeats a quote is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Container

from rag import prompts
from rag.answer.citations import MARKER, check_support, is_claim, parse_markers, split_sentences
from rag.answer.generation import is_refusal
from rag.answer.rules import ALL_ON
from rag.models import Source
from rag.text import keyword_terms


def without_copies(synthesis: str, quotes: list[str]) -> str:
    """The synthesis without its sentences that only repeat a quoted sentence (the quote says it,
    exactly)."""
    if not synthesis or not quotes:
        return synthesis
    quoted = [set(keyword_terms(q)) for q in quotes]
    kept = []
    for sentence in split_sentences(synthesis):
        words = set(keyword_terms(sentence))
        if words and any(
            len(words & q) >= 0.8 * len(words) and len(words & q) >= 0.8 * len(q) for q in quoted
        ):
            continue
        kept.append(sentence)
    return synthesis if len(kept) == len(split_sentences(synthesis)) else " ".join(kept)


def grafted_words(sentence: str, cited: str, question: str) -> list[str]:
    """Words of a synthesis sentence that its cited text lacks and the question holds: a small model
    asked "how do knowledge graph embeddings do link prediction?" writes "Knowledge graph embedding
    methods do link prediction by <what an unrelated abstract says>". Two or more mark the sentence
    unsupported (measured on the audited sentences of docs/lab/answers-history.md: 3 of 8
    unsupported caught, 0 of 42 supported)."""
    source = set(keyword_terms(cited))
    asked = set(keyword_terms(question))
    return [
        w
        for w in dict.fromkeys(keyword_terms(sentence))
        if len(w) >= 4 and w in asked and w not in source
    ]


_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9+\-.]*[A-Za-z0-9+]|[A-Za-z0-9]")
_COPY_RUN = 4  # words copied around a swapped name: the sentence is the source's, a name changed
_LONGEST = 300  # words of a sentence compared: a longer one is a run of text, not a sentence


def swapped_names(sentence: str, cited: str) -> list[tuple[str, str]]:
    """(written, source's) names where a synthesis sentence copies a sentence of its cited text but
    for a name: "Palimpsa is a special case of Palimpsa where forgetting dominates" from "... Mamba2
    is a special case of Palimpsa where forgetting dominates" (the README's example). Every word of
    it is in the source, so the support check passed it. A name is a capitalized word that the
    source capitalizes after a sentence's first word or that has a capital inside, or a word with a
    digit ("GPT-4"); the swap counts when at most two words replace at most three next to a run of
    `_COPY_RUN` or more copied words."""
    import difflib

    written = _TOKEN.findall(MARKER.sub(" ", sentence))
    names = {
        w.lower()
        for s in split_sentences(cited)
        for w in _TOKEN.findall(s)[1:]
        if w[0].isupper() and len(w) > 1
    }

    def is_name(word: str) -> bool:
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            return True
        return word[0].isupper() and (word.lower() in names or word[1:].lower() != word[1:])

    swaps = []
    for source in split_sentences(cited):
        tokens = _TOKEN.findall(source)
        if len(tokens) > _LONGEST or len(written) > _LONGEST:
            continue  # no prose: matching it word by word would take seconds
        ops = difflib.SequenceMatcher(
            None, [w.lower() for w in written], [w.lower() for w in tokens], autojunk=False
        ).get_opcodes()
        for k, (tag, i1, i2, j1, j2) in enumerate(ops):
            if tag != "replace" or i2 - i1 > 2:
                continue
            after = (
                k + 1 < len(ops)
                and ops[k + 1][0] == "equal"
                and ops[k + 1][2] - ops[k + 1][1] >= _COPY_RUN
            )
            before = (
                k > 0 and ops[k - 1][0] == "equal" and ops[k - 1][2] - ops[k - 1][1] >= _COPY_RUN
            )
            if not (after or before):
                continue
            # The source's words beside the copied run: what the written words stand in for.
            replaced = tokens[max(j1, j2 - 3) : j2] if after else tokens[j1 : min(j2, j1 + 3)]
            ours = [w for w in written[i1:i2] if is_name(w)]
            theirs = [w for w in replaced if is_name(w)]
            if ours and theirs and not {w.lower() for w in ours} & {w.lower() for w in theirs}:
                swaps.append((ours[0], theirs[-1] if after else theirs[0]))
    return swaps


def supported_synthesis(
    raw: str,
    read: list[Source],
    picked: list[int],
    embed,
    question: str = "",
    on: Container[str] = ALL_ON,
) -> str:
    """The synthesis's sentences that the support rules on (`on`: rule names) accept, in the
    prompt's numbering. A sentence the model left without a marker cites the source of its evidence
    (`picked`), when that is one source."""
    evidence_sources = list(dict.fromkeys(picked))
    kept, changed = [], False
    for sentence in split_sentences(raw):
        if "refusal_sentences" in on and is_refusal(sentence):
            changed = True
            continue
        if not parse_markers(sentence) and len(evidence_sources) == 1:
            sentence = f"{sentence.rstrip()} [{evidence_sources[0]}]"
            changed = True
        cited_n = set(parse_markers(sentence))
        cited = " ".join(f"{src.title} {src.passage}" for src in read if src.n in cited_n)
        passages = " ".join(src.passage for src in read if src.n in cited_n)
        if (
            ("support" not in on or synthesis_supported(sentence, read, embed))
            and ("example_copies" not in on or not copies_example(sentence, passages))
            and ("grafted_words" not in on or len(grafted_words(sentence, cited, question)) < 2)
            and ("swapped_names" not in on or not swapped_names(sentence, passages))
        ):
            kept.append(sentence)
        else:
            changed = True
    # Unchanged, the text stays as it streamed (its line breaks too).
    return " ".join(kept) if changed else raw


_CLAUSE_END = re.compile(r"(?:\s*\[\d+(?:\s*[,;]\s*\d+)*\])+")
_EXAMPLE_WORDS = [
    w
    for turn in prompts.EVIDENCE_EXAMPLE_TURNS
    if turn["role"] == "assistant"
    for w in [keyword_terms(turn["content"])]
][0]


def synthesis_supported(sentence: str, read: list[Source], embed) -> bool:
    """A synthesis sentence the support check accepts whole and clause by clause (each stretch of
    text up to a marker is checked against what that marker cites: "X [1] and Y [1]" with Y from the
    source and X invented fails)."""
    report = check_support(sentence, read, embed=embed)
    if not report.citations or report.unsupported:
        return False
    clauses = [m for m in re.finditer(rf".+?{_CLAUSE_END.pattern}", sentence)]
    if len(clauses) > 1:
        for m in clauses:
            clause = m.group(0).strip(" ,;")
            if is_claim(clause) and check_support(clause, read, embed=embed).unsupported:
                return False
    return True


def copies_example(sentence: str, cited: str) -> bool:
    """Whether a synthesis sentence repeats a run of four words of the prompt's worked example
    that its cited passages lack (a small model copies the example's answer into a sentence about
    something else)."""
    words = keyword_terms(sentence)
    example = {tuple(_EXAMPLE_WORDS[i : i + 4]) for i in range(len(_EXAMPLE_WORDS) - 3)}
    passage = set(keyword_terms(cited))
    return any(
        tuple(words[i : i + 4]) in example and not set(words[i : i + 4]) <= passage
        for i in range(len(words) - 3)
    )
