"""Evaluation: retrieval and answer metrics over a question set (`rag eval FILE.jsonl`; the file's
format: eval/README.md).

Retrieval metrics use the top 10 papers of `RAG.search`, over the questions with gold papers; answer
metrics use `RAG.ask` with the configured answerer. The modules, in import order: `metrics`,
`questions`, `report`, `runner`; their public names are importable from here.
"""

from __future__ import annotations

from rag.evaluation.metrics import (
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    KIND_ORDER,
    OVERALL,
    OVERALL_ANSWER_METRICS,
    RETRIEVAL_K,
    RETRIEVAL_METRICS,
    UNANSWERABLE_SUBKINDS,
    Section,
    abstention_precision_recall,
    citation_precision,
    hit_at,
    interval95,
    key_fact_recall,
    mean,
    mrr,
    ndcg_at,
    normalize_fact_text,
    recall_at,
    retrieval_scores,
    share,
)
from rag.evaluation.questions import Question, load_questions
from rag.evaluation.report import (
    AnswerFigures,
    EvalReport,
    Figure,
    JSONDict,
    KindCount,
    ModeReport,
    QuestionResult,
    RetrievalFigures,
    metric_parts,
    render_markdown,
    side_by_side,
)
from rag.evaluation.runner import Engine, evaluate, missing_gold

__all__ = [
    "BOOTSTRAP_SAMPLES",
    "BOOTSTRAP_SEED",
    "KIND_ORDER",
    "OVERALL",
    "OVERALL_ANSWER_METRICS",
    "RETRIEVAL_K",
    "RETRIEVAL_METRICS",
    "UNANSWERABLE_SUBKINDS",
    "AnswerFigures",
    "Engine",
    "EvalReport",
    "Figure",
    "JSONDict",
    "KindCount",
    "ModeReport",
    "Question",
    "QuestionResult",
    "RetrievalFigures",
    "Section",
    "abstention_precision_recall",
    "citation_precision",
    "evaluate",
    "hit_at",
    "interval95",
    "key_fact_recall",
    "load_questions",
    "mean",
    "metric_parts",
    "missing_gold",
    "mrr",
    "ndcg_at",
    "normalize_fact_text",
    "recall_at",
    "render_markdown",
    "retrieval_scores",
    "share",
    "side_by_side",
]
