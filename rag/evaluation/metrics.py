"""The pure metric functions, the 95% interval and the constants of `rag eval`.

The metric functions are pure: `ranked` is the list of retrieved paper ids, best first (each paper
once), `gold` the relevant ids. Relevance is binary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Literal

RETRIEVAL_K = 10  # the contract: metrics at k=10 unless named
# Metric names, in the order of the JSON objects and the table rows.
RETRIEVAL_METRICS = ("hit@1", "hit@5", "mrr", "recall@5", "recall@10", "ndcg@10")
OVERALL_ANSWER_METRICS = (
    "key_fact_recall",
    "citation_precision",
    "abstention_precision",
    "abstention_recall",
    "abstained",
    "supported_citations",
)
# the contract's, for empty-gold questions
UNANSWERABLE_SUBKINDS = ("off-topic", "not-covered", "near-miss")
KIND_ORDER = ("keyword", "paraphrase", "numeric", "multi", "unanswerable")
OVERALL = "overall"
# Resamples of the question set for the 95% intervals (`--ci`); fixed seed, so a rerun prints the
# same.
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0

Section = Literal["retrieval", "answers"]


# ---- metric functions (pure) -----------------------------------------------------------------


def hit_at(ranked: Sequence[str], gold: Iterable[str], k: int) -> float:
    """1.0 when any gold paper is in the top k, else 0.0."""
    gold = set(gold)
    return 1.0 if any(p in gold for p in ranked[:k]) else 0.0


def mrr(ranked: Sequence[str], gold: Iterable[str], k: int = RETRIEVAL_K) -> float:
    """Reciprocal rank of the first gold paper within the top k (0.0 when there is none)."""
    gold = set(gold)
    for rank, p in enumerate(ranked[:k], 1):
        if p in gold:
            return 1.0 / rank
    return 0.0


def recall_at(ranked: Sequence[str], gold: Iterable[str], k: int) -> float:
    """Share of the gold papers found in the top k."""
    gold = set(gold)
    if not gold:
        raise ValueError("recall needs at least one gold paper")
    return len(gold & set(ranked[:k])) / len(gold)


def ndcg_at(ranked: Sequence[str], gold: Iterable[str], k: int = RETRIEVAL_K) -> float:
    """nDCG@k with binary relevance: DCG = sum over hits at rank r of 1/log2(r+1), over the ideal
    DCG."""
    gold = set(gold)
    if not gold:
        raise ValueError("nDCG needs at least one gold paper")
    dcg = sum(1.0 / math.log2(rank + 1) for rank, p in enumerate(ranked[:k], 1) if p in gold)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))
    return dcg / ideal


def retrieval_scores(ranked: Sequence[str], gold: Iterable[str]) -> dict[str, float]:
    """Every retrieval metric for one question (gold must be non-empty)."""
    return {
        "hit@1": hit_at(ranked, gold, 1),
        "hit@5": hit_at(ranked, gold, 5),
        "mrr": mrr(ranked, gold, RETRIEVAL_K),
        "recall@5": recall_at(ranked, gold, 5),
        "recall@10": recall_at(ranked, gold, 10),
        "ndcg@10": ndcg_at(ranked, gold, RETRIEVAL_K),
    }


_LATEX_CMD = re.compile(r"\\(textbf|textit|emph|texttt|textsc|underline|mathbf|mathrm)\{")


def normalize_fact_text(text: str) -> str:
    """Lower case, LaTeX markup and typographic dashes/quotes removed, spaces collapsed.

    The key facts were copied from the abstracts with LaTeX stripped (`52.19%` for `52.19\\%`), so
    answers (which quote abstracts verbatim) are normalised the same way before matching.
    """
    s = text.replace("\\times", "x").replace("×", "x").replace("\\%", "%").replace("\\sim", "~")
    s = _LATEX_CMD.sub("", s)
    s = re.sub(r"[${}*\\]", "", s)
    s = (
        s.replace("–", "-")
        .replace("—", "-")
        .replace("’", "'")
        .replace("``", '"')
        .replace("''", '"')
    )
    return re.sub(r"\s+", " ", s).strip().casefold()


def key_fact_recall(answer_text: str, key_facts: list[str]) -> float:
    """Share of the key facts found (case-insensitive, after `normalize_fact_text`) in the
    answer."""
    if not key_facts:
        raise ValueError("key-fact recall needs at least one key fact")
    text = normalize_fact_text(answer_text)
    return sum(normalize_fact_text(f) in text for f in key_facts) / len(key_facts)


def citation_precision(cited: Iterable[str], gold: Iterable[str]) -> float | None:
    """Share of the cited papers that are gold; None when the answer cites nothing."""
    cited = list(dict.fromkeys(cited))
    if not cited:
        return None
    gold = set(gold)
    return sum(p in gold for p in cited) / len(cited)


def abstention_precision_recall(
    abstained: Sequence[bool], unanswerable: Sequence[bool]
) -> tuple[float | None, float | None]:
    """(precision, recall) of abstaining as a detector of unanswerable questions.

    Precision: unanswerable among the abstentions (None when nothing abstained).
    Recall: abstentions among the unanswerable questions (None when there are none).
    """
    if len(abstained) != len(unanswerable):
        raise ValueError("abstained and unanswerable must have the same length")
    both = sum(a and u for a, u in zip(abstained, unanswerable))
    n_abstained, n_unanswerable = sum(abstained), sum(unanswerable)
    return (
        both / n_abstained if n_abstained else None,
        both / n_unanswerable if n_unanswerable else None,
    )


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean, skipping None; None when nothing is left."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def share(flags: Iterable[object]) -> float | None:
    """Share of truthy flags; None when there are none."""
    listed = list(flags)
    return sum(bool(f) for f in listed) / len(listed) if listed else None


# ---- uncertainty -----------------------------------------------------------------------------


def interval95(
    numerators: Sequence[float],
    denominators: Sequence[float],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> list[float] | None:
    """95% interval [low, high] of sum(numerators) / sum(denominators) over questions; None when no
    question counts.

    A share of questions (each adds 0/1 or 1/1: hit@k, abstentions) gets the Wilson score interval,
    which stays honest at 0 or n of n, where a bootstrap would say [1, 1]; any other ratio (MRR,
    nDCG, recall, key facts, citations) a percentile bootstrap: questions resampled with replacement
    `samples` times, resamples without a counted question left out.
    """
    import numpy as np

    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    n = den.sum()
    if not len(num) or n == 0:
        return None
    if np.isin(den, (0.0, 1.0)).all() and np.isin(num[den == 1], (0.0, 1.0)).all():
        z, p = 1.959964, num.sum() / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        low, high = max(0.0, centre - half), min(1.0, centre + half)
    else:
        idx = np.random.default_rng(seed).integers(0, len(num), size=(samples, len(num)))
        nums, dens = num[idx].sum(axis=1), den[idx].sum(axis=1)
        low, high = np.percentile(nums[dens > 0] / dens[dens > 0], [2.5, 97.5])
    return [float(low), float(high)]
