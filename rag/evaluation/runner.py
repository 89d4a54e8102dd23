"""Running an evaluation: `evaluate` asks every question in every mode and builds the `EvalReport`.

Retrieval metrics use the top 10 papers of `RAG.search` and are computed over the questions with
non-empty gold; answer metrics use `RAG.ask` with the configured answerer (extractive without an
LLM).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from rag.errors import InputError
from rag.evaluation.metrics import (
    KIND_ORDER,
    OVERALL,
    RETRIEVAL_K,
    Section,
    abstention_precision_recall,
    citation_precision,
    interval95,
    key_fact_recall,
    mean,
    retrieval_scores,
    share,
)
from rag.evaluation.questions import Question
from rag.evaluation.report import (
    _RETRIEVAL_FIELDS,
    AnswerFigures,
    EvalReport,
    Figure,
    KindCount,
    ModeReport,
    QuestionResult,
    RetrievalFigures,
    metric_parts,
)

if TYPE_CHECKING:
    from tqdm import tqdm


def missing_gold(rag: Engine, questions: Sequence[Question]) -> dict[str, list[str]]:
    """Gold ids that are not in the index, by question id (they count as misses)."""
    wanted = sorted({g for q in questions for g in q["gold"]})
    present: set[str] = set()
    for start in range(0, len(wanted), 500):
        present.update(rag.store.papers(wanted[start : start + 500]))
    out = {q["id"]: [g for g in q["gold"] if g not in present] for q in questions}
    return {qid: ids for qid, ids in out.items() if ids}


# ---- running ---------------------------------------------------------------------------------


class Engine(Protocol):
    """What `evaluate` needs of a `RAG` (tests pass a scripted stand-in)."""

    settings: Any
    store: Any

    def ensure_index(self, progress: bool = ...) -> None: ...

    def search(self, query: str, k: int | None = ..., mode: str | None = ...) -> Sequence[Any]: ...

    def ask(self, question: str, k: int | None = ..., mode: str | None = ...) -> Any: ...


def _with_cached_embeddings(rag: Engine) -> Engine:
    """A shallow copy of `rag` that remembers every vector it embeds; the caller's object is left as
    it is."""
    if not hasattr(rag, "remember_vectors"):
        return rag
    # A copy, not `RAG(rag.settings, embedder=...)`: that would drop a chat model passed as
    # `RAG(llm=...)` and open a second Store (keyword index and vectors loaded again); the copy
    # shares both.
    clone = copy.copy(rag)
    # Every question and source sentence of the evaluation remembered: the same few hundred
    # sentences come back hundreds of times.
    clone.remember_vectors(capacity=50_000, query_capacity=100_000)
    return clone


def _kinds_in_order(questions: Sequence[Question]) -> list[str]:
    present = list(dict.fromkeys(q["kind"] for q in questions))
    return [k for k in KIND_ORDER if k in present] + [k for k in present if k not in KIND_ORDER]


def evaluate(
    rag: Engine,
    questions: Sequence[Question],
    modes: Sequence[str],
    k: int | None = None,
    answers: bool = True,
    progress: bool = False,
    ci: bool = False,
) -> EvalReport:
    """Run every question in every mode; return an `EvalReport` (one `ModeReport` per mode).

    Retrieval: `rag.search(question, k=10, mode=mode)`, metrics per kind and overall over the
    questions with non-empty gold. Answers (when `answers`): `rag.ask(question, k=k, mode=mode)`,
    `k` None meaning the settings' `top_k`. A metric with nothing to average is None. Each mode
    lists its questions (id, kind, gold, the ten papers retrieved, the rank of the first gold one);
    with `ci`, every figure carries a 95% interval (see `interval95`).
    """
    from rag.config import check_k, check_mode

    modes = [check_mode(m) for m in dict.fromkeys(modes)]
    if not modes:
        raise InputError("no retrieval mode to evaluate")
    k = check_k(rag.settings.top_k if k is None else k)
    if not questions:
        raise InputError("no questions to evaluate")
    rag.ensure_index(progress=progress)
    missing = missing_gold(rag, questions)
    runner = _with_cached_embeddings(rag)
    kinds = _kinds_in_order(questions)
    counts = {
        kind: KindCount(
            questions=sum(q["kind"] == kind for q in questions),
            with_gold=sum(q["kind"] == kind and bool(q["gold"]) for q in questions),
            with_key_facts=sum(q["kind"] == kind and bool(q["key_facts"]) for q in questions),
        )
        for kind in kinds
    }
    reports: dict[str, ModeReport] = {}
    bar: tqdm | None = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(questions) * len(modes), desc="eval", unit="q", leave=False)
    try:
        for mode in modes:
            reports[mode] = _evaluate_mode(runner, questions, kinds, mode, k, answers, bar, ci)
    finally:
        if bar is not None:
            bar.close()
    return EvalReport(
        questions=len(questions),
        kinds=counts,
        retrieval_k=RETRIEVAL_K,
        answer_k=k if answers else None,
        missing_gold={qid: tuple(ids) for qid, ids in missing.items()},
        modes=reports,
    )


def _run_question(rag: Engine, q: Question, mode: str, k: int, answers: bool) -> QuestionResult:
    ranked = tuple(s.paper_id for s in rag.search(q["question"], k=RETRIEVAL_K, mode=mode))
    gold = set(q["gold"])
    result = QuestionResult(
        id=q["id"],
        kind=q["kind"],
        gold=tuple(q["gold"]),
        ranked=ranked,
        gold_rank=next((i for i, p in enumerate(ranked, 1) if p in gold), None),
        retrieval=retrieval_scores(list(ranked), q["gold"]) if gold else None,
    )
    if not answers:
        return result
    ans = rag.ask(q["question"], k=k, mode=mode)
    cited = [s.paper_id for s in ans.sources if s.cited]
    return replace(
        result,
        abstained=bool(ans.abstained),
        answer_mode=ans.mode,
        error=ans.error,
        key_fact_recall=key_fact_recall(ans.answer, q["key_facts"]) if q["key_facts"] else None,
        citation_precision=citation_precision(cited, q["gold"]) if q["gold"] else None,
        supported=tuple(c.supported is True for c in ans.citations),
    )


def _figure(
    value: float | None, rows: Sequence[QuestionResult], section: Section, name: str, ci: bool
) -> Figure:
    """`value` with its n and, when `ci`, its 95% interval (both from `metric_parts`)."""
    nums, dens = metric_parts(rows, section, name)
    interval = interval95(nums, dens) if ci else None
    low, high = interval if interval is not None else (None, None)
    return Figure(value=value, n=int(sum(dens)), low=low, high=high)


def _retrieval_figures(rows: Sequence[QuestionResult], ci: bool) -> RetrievalFigures | None:
    scored = [r.retrieval for r in rows if r.retrieval is not None]
    if not scored:
        return None
    return RetrievalFigures(
        **{
            attr: _figure(mean(s[name] for s in scored), rows, "retrieval", name, ci)
            for name, attr in _RETRIEVAL_FIELDS.items()
        }
    )


def _answer_figures(rows: Sequence[QuestionResult], overall: bool, ci: bool) -> AnswerFigures:
    def fig(name: str, value: float | None) -> Figure:
        return _figure(value, rows, "answers", name, ci)

    precision: Figure | None = None
    recall: Figure | None = None
    if overall:
        p, rc = abstention_precision_recall(
            [bool(r.abstained) for r in rows], [not r.gold for r in rows]
        )
        precision, recall = fig("abstention_precision", p), fig("abstention_recall", rc)
    return AnswerFigures(
        key_fact_recall=fig("key_fact_recall", mean(r.key_fact_recall for r in rows)),
        citation_precision=fig("citation_precision", mean(r.citation_precision for r in rows)),
        abstained=fig("abstained", share(r.abstained for r in rows)),
        supported_citations=fig("supported_citations", share(s for r in rows for s in r.supported)),
        abstention_precision=precision,
        abstention_recall=recall,
    )


def _evaluate_mode(
    rag: Engine,
    questions: Sequence[Question],
    kinds: Sequence[str],
    mode: str,
    k: int,
    answers: bool,
    bar: tqdm | None,
    ci: bool = False,
) -> ModeReport:
    started = time.perf_counter()
    rows: list[QuestionResult] = []
    for q in questions:
        rows.append(_run_question(rag, q, mode, k, answers))
        if bar is not None:
            bar.update(1)
    groups: dict[str, list[QuestionResult]] = {
        kind: [r for r in rows if r.kind == kind] for kind in kinds
    }
    groups[OVERALL] = rows
    retrieval: dict[str, RetrievalFigures] = {}
    for group, members in groups.items():
        figures = _retrieval_figures(members, ci)
        if figures is not None:
            retrieval[group] = figures
    answer_figures: dict[str, AnswerFigures] | None = None
    answerer: str | None = None
    if answers:
        answer_figures = {
            group: _answer_figures(members, group == OVERALL, ci)
            for group, members in groups.items()
        }
        answer_modes = sorted({str(r.answer_mode) for r in rows})
        answerer = answer_modes[0] if len(answer_modes) == 1 else "+".join(answer_modes)
    return ModeReport(
        retrieval=retrieval,
        answers=answer_figures,
        questions=tuple(rows),
        seconds=round(time.perf_counter() - started, 2),
        answerer=answerer,
        answer_errors=sum(1 for r in rows if r.error),
        ci=ci,
    )
