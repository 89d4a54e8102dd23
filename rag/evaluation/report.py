"""The result types of `evaluate` (`EvalReport` down to `Figure`), the parts behind each figure's
interval (`metric_parts`) and the markdown table (`render_markdown`).

`EvalReport`: per mode (`ModeReport`), `RetrievalFigures` and `AnswerFigures` per question kind and
overall, each metric a `Figure` (value, optional 95% interval, n), and a `QuestionResult` per
question. `EvalReport.to_dict()` is the `rag eval --json` object (without its `file` key, which the
command adds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag.evaluation.metrics import (
    BOOTSTRAP_SAMPLES,
    OVERALL,
    OVERALL_ANSWER_METRICS,
    RETRIEVAL_METRICS,
    Section,
)

JSONDict = dict[str, Any]


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figure:
    """One metric over a group of questions: its value (None when nothing counts), the 95% interval
    `[low, high]` when intervals were asked for and something counts, and `n`, how many items the
    value averages over (questions; citations for `supported_citations`; abstentions for
    `abstention_precision`)."""

    value: float | None
    n: int = 0
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if (self.low is None) != (self.high is None):
            raise ValueError("an interval needs both low and high")

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.low is None or self.high is None else (self.low, self.high)

    def interval_json(self) -> list[float] | None:
        """The interval as the JSON's `ci95` entries give it: `[low, high]`, or None."""
        iv = self.interval
        return None if iv is None else [iv[0], iv[1]]


# JSON / table metric name -> attribute, in the JSON's order.
_RETRIEVAL_FIELDS = dict(
    zip(
        RETRIEVAL_METRICS,
        ("hit_at_1", "hit_at_5", "mrr", "recall_at_5", "recall_at_10", "ndcg_at_10"),
    )
)


@dataclass(frozen=True, slots=True)
class RetrievalFigures:
    """Retrieval metrics of one group of questions (a kind, or overall) in one mode."""

    hit_at_1: Figure
    hit_at_5: Figure
    mrr: Figure
    recall_at_5: Figure
    recall_at_10: Figure
    ndcg_at_10: Figure

    def figures(self) -> dict[str, Figure]:
        """`{metric name: Figure}` in the JSON's order (`hit@1`, ..., `ndcg@10`)."""
        return {name: getattr(self, attr) for name, attr in _RETRIEVAL_FIELDS.items()}

    def to_dict(self) -> dict[str, float | None]:
        return {name: fig.value for name, fig in self.figures().items()}


@dataclass(frozen=True, slots=True)
class AnswerFigures:
    """Answer metrics of one group of questions in one mode; the abstention detector's precision and
    recall only for the overall group (None elsewhere, and then absent from the JSON)."""

    key_fact_recall: Figure
    citation_precision: Figure
    abstained: Figure
    supported_citations: Figure
    abstention_precision: Figure | None = None
    abstention_recall: Figure | None = None

    def figures(self) -> dict[str, Figure]:
        """`{metric name: Figure}` in the JSON's order, leaving out the metrics this group does not
        have."""
        out: dict[str, Figure] = {}
        for name in OVERALL_ANSWER_METRICS:
            fig: Figure | None = getattr(self, name)
            if fig is not None:
                out[name] = fig
        return out

    def to_dict(self) -> dict[str, float | None]:
        return {name: fig.value for name, fig in self.figures().items()}


@dataclass(frozen=True, slots=True)
class QuestionResult:
    """One question in one mode. The JSON row (`to_dict`) has id, kind, gold, the papers retrieved,
    the rank of the first gold one (None when not in the top 10) and, when answers were evaluated,
    whether the answer abstained; the other fields are the per-question scores the figures average.
    """

    id: str
    kind: str
    gold: tuple[str, ...]
    ranked: tuple[str, ...]
    gold_rank: int | None
    retrieval: Mapping[str, float] | None = None  # `retrieval_scores`; None without gold
    abstained: bool | None = None  # None: answers not evaluated
    key_fact_recall: float | None = None  # None: no key facts (or answers not evaluated)
    citation_precision: float | None = None  # None: no gold, or the answer cites nothing
    supported: tuple[bool, ...] = ()  # per citation: marked supported
    answer_mode: str | None = None
    error: str | None = None

    def to_dict(self) -> JSONDict:
        out: JSONDict = {
            "id": self.id,
            "kind": self.kind,
            "gold": list(self.gold),
            "ranked": list(self.ranked),
            "gold_rank": self.gold_rank,
        }
        if self.abstained is not None:
            out["abstained"] = self.abstained
        return out


@dataclass(frozen=True, slots=True)
class ModeReport:
    """Everything measured in one retrieval mode."""

    # by kind, then overall; only groups with gold questions
    retrieval: Mapping[str, RetrievalFigures]
    # by kind, then overall; None: answers not evaluated
    answers: Mapping[str, AnswerFigures] | None
    questions: tuple[QuestionResult, ...]
    seconds: float
    answerer: str | None = None  # e.g. "extractive"; "a+b" when the answers mixed answerers
    answer_errors: int = 0
    ci: bool = False  # the figures carry 95% intervals

    def figures(self, section: Section, group: str) -> dict[str, Figure]:
        """A group's figures of one section (`{}` when the group or the section has none)."""
        table = self.retrieval if section == "retrieval" else self.answers or {}
        figures = table.get(group)
        return figures.figures() if figures is not None else {}

    def to_dict(self) -> JSONDict:
        out: JSONDict = {
            "retrieval": {group: figs.to_dict() for group, figs in self.retrieval.items()},
            "answers": None
            if self.answers is None
            else {group: figs.to_dict() for group, figs in self.answers.items()},
        }
        if self.answers is not None:
            out["answerer"] = self.answerer
            out["answer_errors"] = self.answer_errors
        if self.ci:
            ci95: JSONDict = {}
            for section, table in (("retrieval", self.retrieval), ("answers", self.answers or {})):
                for group, figs in table.items():
                    ci95.setdefault(section, {})[group] = {
                        name: fig.interval_json() for name, fig in figs.figures().items()
                    }
            out["ci95"] = ci95
        out["questions"] = [q.to_dict() for q in self.questions]
        out["seconds"] = self.seconds
        return out


@dataclass(frozen=True, slots=True)
class KindCount:
    """How many questions of a kind there are, and how many have gold papers and key facts."""

    questions: int
    with_gold: int
    with_key_facts: int

    def to_dict(self) -> dict[str, int]:
        return {
            "questions": self.questions,
            "with_gold": self.with_gold,
            "with_key_facts": self.with_key_facts,
        }


@dataclass(frozen=True, slots=True)
class EvalReport:
    """The result of `evaluate`; `to_dict()` is the `rag eval --json` object without its `file`
    key."""

    questions: int
    # in table order: the known kinds first, then others by first use
    kinds: Mapping[str, KindCount]
    retrieval_k: int
    answer_k: int | None  # None: answers not evaluated
    # question id -> its gold ids that are not in the index
    missing_gold: Mapping[str, tuple[str, ...]]
    modes: Mapping[str, ModeReport] = field(default_factory=dict)

    @property
    def with_gold(self) -> int:
        return sum(count.with_gold for count in self.kinds.values())

    def to_dict(self) -> JSONDict:
        return {
            "questions": self.questions,
            "kinds": {kind: count.to_dict() for kind, count in self.kinds.items()},
            "retrieval_k": self.retrieval_k,
            "answer_k": self.answer_k,
            "missing_gold": {qid: list(ids) for qid, ids in self.missing_gold.items()},
            "modes": {mode: report.to_dict() for mode, report in self.modes.items()},
        }


def side_by_side(reports: Mapping[str, EvalReport]) -> EvalReport:
    """Reports of the same questions on several stores (each queried with the embedding model that
    built it) as one report: a column per store and mode, named "LABEL MODE" (`rag eval
    --also-store`). A gold id missing from any store is listed."""
    if not reports:
        raise ValueError("no reports to put side by side")
    first = next(iter(reports.values()))
    missing: dict[str, tuple[str, ...]] = {}
    for report in reports.values():
        for qid, ids in report.missing_gold.items():
            missing[qid] = tuple(dict.fromkeys((*missing.get(qid, ()), *ids)))
    modes = {
        f"{label} {mode}": info
        for label, report in reports.items()
        for mode, info in report.modes.items()
    }
    return EvalReport(
        questions=first.questions,
        kinds=first.kinds,
        retrieval_k=first.retrieval_k,
        answer_k=first.answer_k,
        missing_gold=missing,
        modes=modes,
    )


# ---- uncertainty -----------------------------------------------------------------------------


def metric_parts(
    rows: Sequence[QuestionResult], section: Section, name: str
) -> tuple[list[float], list[float]]:
    """Per-question (numerator, denominator) lists whose sums' ratio is the metric over `rows`.

    Every metric of the tables is such a ratio: a mean is the sum of the values over the count of
    questions that have one (a question without a value adds 0 / 0), a share of citations or of
    abstentions sums counts. Resampling questions and recomputing the ratio gives its interval.
    """

    def pair(value: float | bool | None) -> tuple[float, float]:
        return (0.0, 0.0) if value is None else (float(value), 1.0)

    if section == "retrieval":
        if name not in _RETRIEVAL_FIELDS:
            raise ValueError(f"unknown metric {name!r}")
        pairs = [pair(r.retrieval[name]) if r.retrieval is not None else (0.0, 0.0) for r in rows]
    elif name == "key_fact_recall":
        pairs = [pair(r.key_fact_recall) for r in rows]
    elif name == "citation_precision":
        pairs = [pair(r.citation_precision) for r in rows]
    elif name == "abstained":
        pairs = [pair(r.abstained) for r in rows]
    elif name == "supported_citations":
        pairs = [(float(sum(r.supported)), float(len(r.supported))) for r in rows]
    elif name == "abstention_precision":
        pairs = [(float(bool(r.abstained) and not r.gold), float(bool(r.abstained))) for r in rows]
    elif name == "abstention_recall":
        pairs = [(float(bool(r.abstained) and not r.gold), float(not r.gold)) for r in rows]
    else:
        raise ValueError(f"unknown metric {name!r}")
    return [p[0] for p in pairs], [p[1] for p in pairs]


# ---- rendering -------------------------------------------------------------------------------

_LABELS = {
    "hit@1": "hit@1",
    "hit@5": "hit@5",
    "mrr": "MRR@10",
    "recall@5": "recall@5",
    "recall@10": "recall@10",
    "ndcg@10": "nDCG@10",
    "key_fact_recall": "key-fact recall",
    "citation_precision": "citation precision",
    "abstention_precision": "abstention precision",
    "abstention_recall": "abstention recall",
    "abstained": "abstained (share)",
    "supported_citations": "supported citations",
}
# "abstained" is good on unanswerable questions and bad on the others: never bolded.
_NOT_RANKED = {"abstained"}
# Per kind, the table shows these answer metrics (the JSON has them all).
_KIND_ANSWER_ROWS = ("key_fact_recall", "citation_precision", "abstained")


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def render_markdown(report: EvalReport, source: str | None = None, misses: bool = False) -> str:
    """One table: a row per (kind, metric), a column per mode; the best value of a row in bold.

    When the figures have intervals (`evaluate(ci=True)`), each value is followed by its 95%
    interval. With `misses`, a line per mode lists the questions whose first gold paper is not
    ranked first.
    """
    modes = list(report.modes)
    kinds = list(report.kinds)
    counts = ", ".join(f"{kind} {count.questions}" for kind, count in report.kinds.items())
    first = next(iter(report.modes.values()))
    lines = [
        f"{source + ': ' if source else ''}{report.questions} questions ({counts}); "
        f"retrieval top {report.retrieval_k}"
        + (
            f", answers: {first.answerer or '?'} at k={report.answer_k}"
            if first.answers is not None
            else ", answers not evaluated"
        )
        + ".",
        "",
    ]
    lines.append("| kind | metric | " + " | ".join(modes) + " |")
    lines.append("|---|---|" + "---:|" * len(modes))
    for group in [*kinds, OVERALL]:
        n = report.questions if group == OVERALL else report.kinds[group].questions
        rows: list[tuple[str, list[str]]] = []
        sections: tuple[tuple[Section, Sequence[str]], ...] = (
            ("retrieval", RETRIEVAL_METRICS),
            ("answers", OVERALL_ANSWER_METRICS if group == OVERALL else _KIND_ANSWER_ROWS),
        )
        for section, names in sections:
            by_mode = [report.modes[m].figures(section, group) for m in modes]
            for name in names:
                figures = [figs.get(name) for figs in by_mode]
                values = [None if fig is None else fig.value for fig in figures]
                if all(v is None for v in values):
                    continue
                cells = [_fmt(v) for v in values]
                known = [v for v in values if v is not None]
                if len(modes) > 1 and name not in _NOT_RANKED and len(set(known)) > 1:
                    best = max(known)
                    cells = [f"**{c}**" if v == best else c for c, v in zip(cells, values)]
                intervals = [None if fig is None else fig.interval for fig in figures]
                cells = [
                    f"{c} [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else c
                    for c, iv in zip(cells, intervals)
                ]
                rows.append((_LABELS.get(name, name), cells))
        for i, (label, cells) in enumerate(rows):
            head = f"{group} ({n})" if i == 0 else ""
            lines.append(f"| {head} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Retrieval metrics average the {report.with_gold} questions with gold papers; MRR counts"
        " the first gold paper in the top 10; nDCG uses binary relevance."
    )
    if first.answers is not None:
        lines.append(
            "Key-fact recall: share of a question's key facts found in its answer"
            " (case-insensitive, LaTeX markup stripped). Citation precision: share of cited papers"
            " that are gold, averaged over the answers to answerable questions that cite something."
            " Abstained: share of the kind's questions answered with an abstention. Abstention"
            " precision/recall: abstaining as a detector of the empty-gold questions. Supported"
            " citations: share of all citations marked supported."
        )
    if any(info.ci for info in report.modes.values()):
        lines.append(
            "[low, high]: 95% interval over the questions: Wilson score interval where every"
            " question scores 0 or 1 (hit@k, shares of questions), percentile bootstrap"
            f" ({BOOTSTRAP_SAMPLES} resamples) for the rest."
        )
    timing = ", ".join(f"{m} {info.seconds:.1f} s" for m, info in report.modes.items())
    lines.append(f"Time: {timing}.")
    if misses:
        lines += [
            "",
            "Misses at hit@1 (question id: rank of its first gold paper, - when not in the top "
            f"{report.retrieval_k}):",
            "",
        ]
        for mode, info in report.modes.items():
            missed = [
                f"{q.id}: {q.gold_rank or '-'}"
                for q in info.questions
                if q.gold and q.gold_rank != 1
            ]
            lines.append(f"- {mode}: " + (", ".join(missed) if missed else "none"))
    return "\n".join(lines) + "\n"
