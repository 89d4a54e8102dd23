"""Every rule of the answer step, in the order it runs: `GATES` before the model reads anything,
`CHECKS` on what was answered (the extractive answer's quotes, the model's reply). A row names the
rule, the `Settings` field that turns it off (None: always on), its thresholds (Settings fields or
module constants), what it applies to, where it is written, and where docs/lab/answers-history.md
measured it. The `abstained_by` label a rule sets when it holds an answer back is `Answer`'s
(rag/models.py); tests/test_rules.py fails when a label has no row or a row no line in
docs/answers.md, whose table of rules is written from this one (`python -m rag.config_docs`).

This module is data (and which rows a `Settings` turns off): the rules themselves are the
functions each row's `where` names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rag.config import Settings
from rag.errors import InputError
from rag.models import AbstainedBy

# What a rule applies to: the answer paths (extractive quotes, the evidence-first LLM answer, the
# free-form one) and the question's form ("which papers" lists, or single answers).
Target = Literal["extractive", "evidence", "free", "lists", "single"]

HISTORY = "lab/answers-history.md"


@dataclass(frozen=True)
class Rule:
    """One rule: `name` is its row (and its `--without` name in `rag eval`), `label` the
    `abstained_by` it sets when it holds an answer back alone (None: it drops sentences or quotes,
    or only chooses between outcomes)."""

    name: str
    label: AbstainedBy | None
    setting: str | None
    thresholds: tuple[str, ...]
    applies_to: tuple[Target, ...]
    where: str
    doc_anchor: str
    summary: str


_ALL: tuple[Target, ...] = ("lists", "single")

GATES: tuple[Rule, ...] = (
    Rule(
        "retrieval",
        "retrieval",
        None,
        ("abstain_threshold", "unknown_name_threshold"),
        ("extractive", "evidence", "free", *_ALL),
        "rag.answer.rules.retrieval:should_abstain",
        "#the-rules",
        "Nothing retrieved, a name no indexed paper or author mentions while no paper is close, or"
        " the best paper less similar than the threshold: not covered.",
    ),
    Rule(
        "topic",
        "topic",
        "topic_check",
        ("topic.ABSENT_SHARE",),
        ("extractive", "evidence", *_ALL),
        "rag.answer.rules.topic:absent_from",
        f"{HISTORY}#topics-none-of-the-papers-holds",
        "A topic term or name of the question that none of the retrieved papers holds: the model is"
        " not asked; the answer names the term, then quotes the closest sentences when the papers"
        " are on the subject (not stated), else refuses (not covered).",
    ),
    Rule(
        "background",
        "background",
        "background_check",
        ("background_margin", "background.LIST_EXTRA"),
        ("extractive", "evidence", "free", *_ALL),
        "rag.answer.rules.background:uncovered",
        f"{HISTORY}#topics-papers-outside-the-index-hold",
        "A paper of the shipped library (outside the index) is far closer to the question than any"
        " indexed paper: not covered. Skipped when the topic rule already named a missing term.",
    ),
)

CHECKS: tuple[Rule, ...] = (
    Rule(
        "refusal",
        "model",
        None,
        (),
        ("free", *_ALL),
        "rag.answer.generation:is_refusal",
        "#the-rules",
        "The model's reply is the prompt's refusal (or empty): not covered.",
    ),
    Rule(
        "support",
        "support",
        None,
        ("citations.LEXICAL_SUPPORT", "citations.SEMANTIC_SUPPORT"),
        ("evidence", *_ALL),
        "rag.answer.rules.support:supported_synthesis",
        f"{HISTORY}#the-support-check-against-a-reader",
        "Each sentence of the synthesis is checked against the sentences it cites, whole and clause"
        " by clause; an unsupported one is dropped (the quotes stay); nothing left: held back.",
    ),
    Rule(
        "grafted_words",
        None,
        None,
        ("2 words",),
        ("evidence", *_ALL),
        "rag.answer.rules.support:grafted_words",
        f"{HISTORY}#the-support-check-against-a-reader",
        "A synthesis sentence with two or more words of the question that its cited text lacks is"
        " dropped.",
    ),
    Rule(
        "swapped_names",
        None,
        None,
        ("support._COPY_RUN",),
        ("evidence", *_ALL),
        "rag.answer.rules.support:swapped_names",
        "#the-rules",
        "A synthesis sentence that copies its cited sentence but for a name is dropped.",
    ),
    Rule(
        "example_copies",
        None,
        None,
        ("4 words",),
        ("evidence", *_ALL),
        "rag.answer.rules.support:copies_example",
        "#the-rules",
        "A synthesis sentence repeating four words of the prompt's worked example that its sources"
        " lack is dropped.",
    ),
    Rule(
        "refusal_sentences",
        None,
        None,
        (),
        ("evidence", *_ALL),
        "rag.answer.rules.support:supported_synthesis",
        "#the-rules",
        "A synthesis sentence that is the refusal phrase is dropped.",
    ),
    Rule(
        "boilerplate",
        None,
        None,
        ("extractive.BOILERPLATE",),
        ("extractive", "evidence", *_ALL),
        "rag.answer.extractive:BOILERPLATE",
        "#the-rules",
        "A sentence that is an abstract's boilerplate (code links, 'accepted at') is not quoted,"
        " whether the model named it or it is the closest to the question.",
    ),
    Rule(
        "list_fit",
        None,
        None,
        ("extractive.FIT_SHARE",),
        ("evidence", "lists"),
        "rag.answer.rules.list_fit:fitting",
        "#the-rules",
        'A "which papers" list keeps only papers that fit the question as the extractive answer'
        " judges fit (a sentence at least this share of the best one's score): a line or claim for"
        " another paper is dropped.",
    ),
    Rule(
        "premise",
        None,
        None,
        ("premise._THE_PAPER",),
        ("evidence", "single"),
        "rag.answer.rules.premise:without_premise",
        f"{HISTORY}#the-abstracts-premise",
        "A single answer does not quote an abstract's premise (the sentences before it says what"
        " the paper does: 'we', 'this paper'): beside another sentence of that paper it is dropped;"
        " alone, the paper's sentence past the premise closest to the question is quoted instead."
        " The turn sentence ('We propose X') is quoted with the sentence after it.",
    ),
    Rule(
        "parts",
        None,
        None,
        ("parts.PART_MATCH", "parts.UNSTATED_BELOW"),
        ("evidence", "single"),
        "rag.answer.rules.parts:cover",
        "#the-rules",
        "A question asking two things: for a part no quote answers, the cited papers' sentence that"
        " does is quoted too; a part none answers is named as not stated.",
    ),
    Rule(
        "quoted_papers",
        None,
        None,
        (),
        ("evidence", *_ALL),
        "rag.answer.evidence_answer:after_quotes",
        "#the-rules",
        "Quotes shown as soon as the model names its sentences (the checks below that judge quotes"
        " pass on them alone): a synthesis sentence citing a paper none of them comes from is"
        " dropped, since the checks are not asked again once the quotes are shown.",
    ),
    Rule(
        "quote_repeats",
        None,
        None,
        ("0.8 shared words",),
        ("evidence", *_ALL),
        "rag.answer.rules.support:without_copies",
        "#the-rules",
        "A synthesis sentence that only repeats a quoted sentence is dropped (the quote says it).",
    ),
    Rule(
        "check",
        "check",
        "llm_check",
        ("llm_check_threshold",),
        ("evidence", "free", *_ALL),
        "rag.answer.rules.llm_check:evidence_check",
        f"{HISTORY}#answerability-signals-what-each-tells-apart",
        "Off by default. The model's probability that the quoted sentences (evidence) or its"
        " sources (free, asked before answering) state the answer; below the threshold: held back.",
    ),
    Rule(
        "answer_type",
        "answer_type",
        "answer_type_check",
        (),
        ("evidence", *_ALL),
        "rag.answer.rules.answer_type:gives_asked_type",
        f"{HISTORY}#number-and-names-questions-the-answers-type",
        "A number question answered without a new number, a names question without a new name: not"
        " stated, the closest sentences quoted.",
    ),
    Rule(
        "answer_source",
        "answer_source",
        "answer_type_check",
        ("answer_type.SUBJECT_SHARE",),
        ("evidence", *_ALL),
        "rag.answer.rules.answer_type:from_another_paper",
        f"{HISTORY}#number-and-names-questions-the-answers-type",
        "The number or names asked for come only from another paper than the one asked about: not"
        " stated, quoting the papers on the question's subject.",
    ),
    Rule(
        "answer_names",
        "answer_names",
        "answer_type_check",
        (),
        ("extractive", "evidence", "single"),
        "rag.answer.rules.answer_type:unwritten_names",
        f"{HISTORY}#number-and-names-questions-the-answers-type",
        "A name the question asks about that none of the cited papers writes: the answer names it;"
        " not stated (quotes kept) when the papers are on the subject, else not covered.",
    ),
    Rule(
        "first_paper",
        "first_paper",
        None,
        ("first_paper.CLOSE_SHARE",),
        ("evidence", "single"),
        "rag.answer.rules.first_paper:cites_first",
        f"{HISTORY}#the-paper-a-description-fits",
        "A single answer that cites none of the paper retrieval ranked first (a small model"
        " answering from a paper that only shares words with the question): not stated, quoting"
        " the first paper's sentence closest to the question. One that cites it drops the quotes"
        " and claims of papers less close to the question than the first that hold no rare name"
        " of it.",
    ),
    Rule(
        "evidence",
        "evidence",
        None,
        (),
        ("evidence", *_ALL),
        "rag.answer.evidence:ReplyParser",
        "#the-rules",
        "The model named no sentence that states the answer, refused, or wrote nothing: held back.",
    ),
    Rule(
        "on_subject",
        None,
        None,
        ("not_stated_threshold",),
        ("extractive", "evidence", *_ALL),
        "rag.answer.case:on_the_subject",
        "#what-each-outcome-means",
        "Chooses the held-back outcome: not stated (closest sentences quoted) when a name of the"
        " question is in a retrieved paper or the best paper is at least this similar, else not"
        " covered.",
    ),
    Rule(
        "filter",
        "filter",
        None,
        (),
        ("evidence", "free", *_ALL),
        "rag.answer.rules.injection_output:clean_answer",
        "#the-rules",
        "The injection output rule: sentences and links that only a source's instructions asked for"
        " are removed; nothing cited left: withdrawn.",
    ),
    Rule(
        "require_support",
        "support",
        "llm_require_support",
        ("citations.LEXICAL_SUPPORT", "citations.SEMANTIC_SUPPORT"),
        ("free", *_ALL),
        "rag.answer.free:generated",
        "#the-rules",
        "A free-form answer none of whose citations the support check finds in the cited passage is"
        " withdrawn.",
    ),
)

RULES: tuple[Rule, ...] = GATES + CHECKS
ALL_ON = frozenset(r.name for r in RULES)


def rule(name: str) -> Rule:
    """The row named `name` (KeyError naming the rows otherwise)."""
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(f"no rule {name!r}; the rules: {', '.join(r.name for r in RULES)}")


def switchable() -> list[str]:
    """Every rule, by name: each can be turned off (`RAG_RULES_OFF`, `rag eval --without`)."""
    return [r.name for r in RULES]


def check_names(names: Iterable[str], where: str = "RAG_RULES_OFF") -> None:
    """An `InputError` naming the rules when a name in `names` is no row of the table."""
    unknown = [n for n in names if n not in {r.name for r in RULES}]
    if unknown:
        raise InputError(
            f"{where}: no rule {unknown[0]!r}; the rules: {', '.join(switchable())}"
            " (docs/answers.md)"
        )


def active(settings: Settings) -> frozenset[str]:
    """The rules on under `settings`: every row but those `rules_off` names and those whose own
    setting is off. What a path does with a rule that is off is said where it asks."""
    check_names(settings.rules_off)
    off = set(settings.rules_off)
    return frozenset(
        r.name
        for r in RULES
        if r.name not in off and (r.setting is None or getattr(settings, r.setting))
    )
