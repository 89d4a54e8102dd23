"""Evaluation: retrieval and answer metrics over a question set (`rag eval FILE.jsonl`).

Question file: one JSON object per line, `{id, question, gold: [paper ids], kind, key_facts?}`
(see `eval/README.md`). Retrieval metrics use the top 10 papers of `RAG.search` and are computed
over the questions with non-empty gold; answer metrics use `RAG.ask` with the configured answerer
(extractive without an LLM).

The metric functions at the top are pure: `ranked` is the list of retrieved paper ids, best first
(each paper once), `gold` the relevant ids. Relevance is binary.

`evaluate` returns an `EvalReport`: per mode (`ModeReport`), `RetrievalFigures` and `AnswerFigures`
per question kind and overall, each metric a `Figure` (value, optional 95% interval, n), and a
`QuestionResult` per question. `EvalReport.to_dict()` is the `rag eval --json` object (without its
`file` key, which the command adds).
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

from .errors import InputError, RagError

if TYPE_CHECKING:
    from tqdm import tqdm

RETRIEVAL_K = 10  # the contract: metrics at k=10 unless named
# Metric names, in the order of the JSON objects and the table rows.
RETRIEVAL_METRICS = ("hit@1", "hit@5", "mrr", "recall@5", "recall@10", "ndcg@10")
OVERALL_ANSWER_METRICS = ("key_fact_recall", "citation_precision", "abstention_precision",
                          "abstention_recall", "abstained", "supported_citations")
UNANSWERABLE_SUBKINDS = ("off-topic", "not-covered", "near-miss")  # the contract's, for empty-gold questions
KIND_ORDER = ("keyword", "paraphrase", "numeric", "multi", "unanswerable")
OVERALL = "overall"
# Resamples of the question set for the 95% intervals (`--ci`); fixed seed, so a rerun prints the same.
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0

Section = Literal["retrieval", "answers"]
JSONDict = dict[str, Any]


class _QuestionFields(TypedDict):
    id: str
    question: str
    gold: list[str]  # relevant paper ids; empty for an unanswerable question
    kind: str
    key_facts: list[str]
    line: int  # in the question file


class Question(_QuestionFields, total=False):
    """A checked question-file item, as `load_questions` returns it."""

    subkind: str  # unanswerable questions only: one of UNANSWERABLE_SUBKINDS


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
    """nDCG@k with binary relevance: DCG = sum over hits at rank r of 1/log2(r+1), over the ideal DCG."""
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
    s = s.replace("–", "-").replace("—", "-").replace("’", "'").replace("``", '"').replace("''", '"')
    return re.sub(r"\s+", " ", s).strip().casefold()


def key_fact_recall(answer_text: str, key_facts: list[str]) -> float:
    """Share of the key facts found (case-insensitive, after `normalize_fact_text`) in the answer."""
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


def abstention_precision_recall(abstained: Sequence[bool], unanswerable: Sequence[bool]) -> tuple[float | None, float | None]:
    """(precision, recall) of abstaining as a detector of unanswerable questions.

    Precision: unanswerable among the abstentions (None when nothing abstained).
    Recall: abstentions among the unanswerable questions (None when there are none).
    """
    if len(abstained) != len(unanswerable):
        raise ValueError("abstained and unanswerable must have the same length")
    both = sum(a and u for a, u in zip(abstained, unanswerable))
    n_abstained, n_unanswerable = sum(abstained), sum(unanswerable)
    return (both / n_abstained if n_abstained else None, both / n_unanswerable if n_unanswerable else None)


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean, skipping None; None when nothing is left."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def share(flags: Iterable[object]) -> float | None:
    """Share of truthy flags; None when there are none."""
    listed = list(flags)
    return sum(bool(f) for f in listed) / len(listed) if listed else None


# ---- question files --------------------------------------------------------------------------

def load_questions(path: str | Path) -> list[Question]:
    """Read and validate a question file. A bad line raises `InputError("file:line: what is wrong")`."""
    from .answer import clean_question

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a .jsonl file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(item, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(item).__name__}")
        for key in ("id", "question", "gold", "kind"):
            if key not in item:
                raise InputError(f"{where}: missing field {key!r}")
        qid = item["id"]
        if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
            raise InputError(f"{where}: 'id' must be a non-empty string")
        qid = str(qid)
        if qid in seen:
            raise InputError(f"{where}: duplicate id {qid!r} (first on line {seen[qid]})")
        seen[qid] = lineno
        if not isinstance(item["question"], str):
            raise InputError(f"{where}: 'question' must be text")
        try:
            question = clean_question(item["question"])
        except RagError as exc:
            raise InputError(f"{where}: {exc}") from None
        kind = item["kind"]
        if not isinstance(kind, str) or not kind.strip():
            raise InputError(f"{where}: 'kind' must be a non-empty string")
        if kind.strip() == OVERALL:
            raise InputError(f"{where}: kind {OVERALL!r} is reserved for the totals")
        gold = item["gold"]
        if not isinstance(gold, list) or not all(isinstance(g, str) and g.strip() for g in gold):
            raise InputError(f"{where}: 'gold' must be a list of paper ids (strings)")
        gold = [g.strip() for g in gold]
        if len(set(gold)) != len(gold):
            raise InputError(f"{where}: 'gold' repeats a paper id")
        facts = item.get("key_facts", [])
        if facts is None:
            facts = []
        if not isinstance(facts, list) or not all(isinstance(f, str) and f.strip() for f in facts):
            raise InputError(f"{where}: 'key_facts' must be a list of non-empty strings")
        subkind = item.get("subkind")
        if subkind is not None and (gold or subkind not in UNANSWERABLE_SUBKINDS):
            raise InputError(f"{where}: 'subkind' is for unanswerable questions (empty gold), one of "
                             f"{', '.join(UNANSWERABLE_SUBKINDS)}")
        checked: Question = {"id": qid, "question": question, "gold": gold, "kind": kind.strip(),
                             "key_facts": facts, "line": lineno}
        if subkind:
            checked["subkind"] = subkind
        questions.append(checked)
    if not questions:
        raise InputError(f"{path}: no questions")
    return questions


def missing_gold(rag: Engine, questions: Sequence[Question]) -> dict[str, list[str]]:
    """Gold ids that are not in the index, by question id (they count as misses)."""
    wanted = sorted({g for q in questions for g in q["gold"]})
    present: set[str] = set()
    for start in range(0, len(wanted), 500):
        present.update(rag.store.papers(wanted[start:start + 500]))
    out = {q["id"]: [g for g in q["gold"] if g not in present] for q in questions}
    return {qid: ids for qid, ids in out.items() if ids}


# ---- results ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Figure:
    """One metric over a group of questions: its value (None when nothing counts), the 95% interval
    `[low, high]` when intervals were asked for and something counts, and `n`, how many items the value
    averages over (questions; citations for `supported_citations`; abstentions for `abstention_precision`)."""

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
_RETRIEVAL_FIELDS = dict(zip(RETRIEVAL_METRICS,
                             ("hit_at_1", "hit_at_5", "mrr", "recall_at_5", "recall_at_10", "ndcg_at_10")))


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
        """`{metric name: Figure}` in the JSON's order, leaving out the metrics this group does not have."""
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
    """One question in one mode. The JSON row (`to_dict`) has id, kind, gold, the papers retrieved, the
    rank of the first gold one (None when not in the top 10) and, when answers were evaluated, whether
    the answer abstained; the other fields are the per-question scores the figures average."""

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
        out: JSONDict = {"id": self.id, "kind": self.kind, "gold": list(self.gold), "ranked": list(self.ranked),
                         "gold_rank": self.gold_rank}
        if self.abstained is not None:
            out["abstained"] = self.abstained
        return out


@dataclass(frozen=True, slots=True)
class ModeReport:
    """Everything measured in one retrieval mode."""

    retrieval: Mapping[str, RetrievalFigures]  # by kind, then overall; only groups with gold questions
    answers: Mapping[str, AnswerFigures] | None  # by kind, then overall; None: answers not evaluated
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
            "answers": None if self.answers is None else {group: figs.to_dict() for group, figs in self.answers.items()},
        }
        if self.answers is not None:
            out["answerer"] = self.answerer
            out["answer_errors"] = self.answer_errors
        if self.ci:
            ci95: JSONDict = {}
            for section, table in (("retrieval", self.retrieval), ("answers", self.answers or {})):
                for group, figs in table.items():
                    ci95.setdefault(section, {})[group] = {name: fig.interval_json()
                                                           for name, fig in figs.figures().items()}
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
        return {"questions": self.questions, "with_gold": self.with_gold, "with_key_facts": self.with_key_facts}


@dataclass(frozen=True, slots=True)
class EvalReport:
    """The result of `evaluate`; `to_dict()` is the `rag eval --json` object without its `file` key."""

    questions: int
    kinds: Mapping[str, KindCount]  # in table order: the known kinds first, then others by first use
    retrieval_k: int
    answer_k: int | None  # None: answers not evaluated
    missing_gold: Mapping[str, tuple[str, ...]]  # question id -> its gold ids that are not in the index
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


# ---- running ---------------------------------------------------------------------------------

class Engine(Protocol):
    """What `evaluate` needs of a `RAG` (tests pass a scripted stand-in)."""

    settings: Any
    store: Any

    def ensure_index(self, progress: bool = ...) -> None: ...

    def search(self, query: str, k: int | None = ..., mode: str | None = ...) -> Sequence[Any]: ...

    def ask(self, question: str, k: int | None = ..., mode: str | None = ...) -> Any: ...


class _CachingEmbedder:
    """Remembers the vectors of texts already embedded (abstract sentences recur across questions).

    The extractive answerer embeds the sentences of the top papers for every question; in an
    evaluation the same few hundred sentences come back hundreds of times. Vectors do not depend
    on the batch a text is embedded in (checked: cosine > 0.9999998), so results are unchanged.
    """

    def __init__(self, inner: Any, max_entries: int = 50_000) -> None:
        self._inner = inner
        self._cache: OrderedDict[tuple[str, bool], Any] = OrderedDict()
        self._queries: dict[str, list[float]] = {}  # a few hundred questions: kept whole
        self._max = max_entries

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        import numpy as np

        keys = [(t, truncate) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if missing:
            vectors = self._inner.embed([t for t, _ in missing], truncate=truncate)
            for key, vec in zip(missing, vectors):
                self._cache[key] = np.asarray(vec, dtype=np.float32)
        out = []
        for key in keys:
            self._cache.move_to_end(key)
            out.append(self._cache[key].tolist())
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return out

    def embed_query(self, text: str) -> list[float]:
        # The model's own question vector, not `embed`'s: a model may embed questions differently from
        # documents (nomic-embed-text-v1.5's task prefixes).
        if text not in self._queries:
            self._queries[text] = list(self._inner.embed_query(text))
        return list(self._queries[text])


def _with_cached_embeddings(rag: Engine) -> Engine:
    """A shallow copy of `rag` whose embedder caches vectors; the caller's object is left as it is."""
    if not hasattr(rag, "_embedder") or not hasattr(rag, "embedder"):
        return rag
    clone = copy.copy(rag)
    clone._embedder = _CachingEmbedder(rag.embedder)
    return clone


def _kinds_in_order(questions: Sequence[Question]) -> list[str]:
    present = list(dict.fromkeys(q["kind"] for q in questions))
    return [k for k in KIND_ORDER if k in present] + [k for k in present if k not in KIND_ORDER]


def evaluate(rag: Engine, questions: Sequence[Question], modes: Sequence[str], k: int | None = None,
             answers: bool = True, progress: bool = False, ci: bool = False) -> EvalReport:
    """Run every question in every mode; return an `EvalReport` (one `ModeReport` per mode).

    Retrieval: `rag.search(question, k=10, mode=mode)`, metrics per kind and overall over the
    questions with non-empty gold. Answers (when `answers`): `rag.ask(question, k=k, mode=mode)`
    with the configured answerer; `k` None means the settings' `top_k` (as `RAG.ask`). A metric with
    nothing to average has the value None. Each mode also lists its questions (id, kind, gold, the ten
    papers retrieved, the rank of the first gold one) and, with `ci`, every figure carries a 95%
    interval (see `interval95`).
    """
    from .config import check_k, check_mode

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
    counts = {kind: KindCount(questions=sum(q["kind"] == kind for q in questions),
                              with_gold=sum(q["kind"] == kind and bool(q["gold"]) for q in questions),
                              with_key_facts=sum(q["kind"] == kind and bool(q["key_facts"]) for q in questions))
              for kind in kinds}
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
    return EvalReport(questions=len(questions), kinds=counts, retrieval_k=RETRIEVAL_K,
                      answer_k=k if answers else None,
                      missing_gold={qid: tuple(ids) for qid, ids in missing.items()}, modes=reports)


def _run_question(rag: Engine, q: Question, mode: str, k: int, answers: bool) -> QuestionResult:
    ranked = tuple(s.paper_id for s in rag.search(q["question"], k=RETRIEVAL_K, mode=mode))
    gold = set(q["gold"])
    result = QuestionResult(id=q["id"], kind=q["kind"], gold=tuple(q["gold"]), ranked=ranked,
                            gold_rank=next((i for i, p in enumerate(ranked, 1) if p in gold), None),
                            retrieval=retrieval_scores(list(ranked), q["gold"]) if gold else None)
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


def _figure(value: float | None, rows: Sequence[QuestionResult], section: Section, name: str, ci: bool) -> Figure:
    """`value` with its n and, when `ci`, its 95% interval (both from `metric_parts`)."""
    nums, dens = metric_parts(rows, section, name)
    interval = interval95(nums, dens) if ci else None
    low, high = interval if interval is not None else (None, None)
    return Figure(value=value, n=int(sum(dens)), low=low, high=high)


def _retrieval_figures(rows: Sequence[QuestionResult], ci: bool) -> RetrievalFigures | None:
    scored = [r.retrieval for r in rows if r.retrieval is not None]
    if not scored:
        return None
    return RetrievalFigures(**{attr: _figure(mean(s[name] for s in scored), rows, "retrieval", name, ci)
                               for name, attr in _RETRIEVAL_FIELDS.items()})


def _answer_figures(rows: Sequence[QuestionResult], overall: bool, ci: bool) -> AnswerFigures:
    def fig(name: str, value: float | None) -> Figure:
        return _figure(value, rows, "answers", name, ci)

    precision: Figure | None = None
    recall: Figure | None = None
    if overall:
        p, rc = abstention_precision_recall([bool(r.abstained) for r in rows], [not r.gold for r in rows])
        precision, recall = fig("abstention_precision", p), fig("abstention_recall", rc)
    return AnswerFigures(
        key_fact_recall=fig("key_fact_recall", mean(r.key_fact_recall for r in rows)),
        citation_precision=fig("citation_precision", mean(r.citation_precision for r in rows)),
        abstained=fig("abstained", share(r.abstained for r in rows)),
        supported_citations=fig("supported_citations", share(s for r in rows for s in r.supported)),
        abstention_precision=precision,
        abstention_recall=recall,
    )


def _evaluate_mode(rag: Engine, questions: Sequence[Question], kinds: Sequence[str], mode: str, k: int,
                   answers: bool, bar: tqdm | None, ci: bool = False) -> ModeReport:
    started = time.perf_counter()
    rows: list[QuestionResult] = []
    for q in questions:
        rows.append(_run_question(rag, q, mode, k, answers))
        if bar is not None:
            bar.update(1)
    groups: dict[str, list[QuestionResult]] = {kind: [r for r in rows if r.kind == kind] for kind in kinds}
    groups[OVERALL] = rows
    retrieval: dict[str, RetrievalFigures] = {}
    for group, members in groups.items():
        figures = _retrieval_figures(members, ci)
        if figures is not None:
            retrieval[group] = figures
    answer_figures: dict[str, AnswerFigures] | None = None
    answerer: str | None = None
    if answers:
        answer_figures = {group: _answer_figures(members, group == OVERALL, ci) for group, members in groups.items()}
        answer_modes = sorted({str(r.answer_mode) for r in rows})
        answerer = answer_modes[0] if len(answer_modes) == 1 else "+".join(answer_modes)
    return ModeReport(retrieval=retrieval, answers=answer_figures, questions=tuple(rows),
                      seconds=round(time.perf_counter() - started, 2), answerer=answerer,
                      answer_errors=sum(1 for r in rows if r.error), ci=ci)


# ---- uncertainty -----------------------------------------------------------------------------

def metric_parts(rows: Sequence[QuestionResult], section: Section, name: str) -> tuple[list[float], list[float]]:
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


def interval95(numerators: Sequence[float], denominators: Sequence[float], samples: int = BOOTSTRAP_SAMPLES,
               seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """95% interval [low, high] of sum(numerators) / sum(denominators) over questions; None when no
    question counts.

    On a few dozen questions one question moves a hit rate by several points: the interval says how
    far apart two figures must be before the difference means something. A share of questions (every
    question adds 0/1 or 1/1: hit@k, abstentions) gets the Wilson score interval, which stays honest
    at 0 or n out of n (26 of 26 is [0.87, 1.00], where a bootstrap would say [1, 1]). Any other
    ratio (MRR, nDCG, recall, key facts, citations) gets a percentile bootstrap: questions resampled
    with replacement `samples` times; resamples without a counted question are left out.
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


# ---- rendering -------------------------------------------------------------------------------

_LABELS = {
    "hit@1": "hit@1", "hit@5": "hit@5", "mrr": "MRR@10", "recall@5": "recall@5", "recall@10": "recall@10",
    "ndcg@10": "nDCG@10", "key_fact_recall": "key-fact recall", "citation_precision": "citation precision",
    "abstention_precision": "abstention precision", "abstention_recall": "abstention recall",
    "abstained": "abstained (share)", "supported_citations": "supported citations",
}
# "abstained" is good on unanswerable questions and bad on the others: never bolded.
_NOT_RANKED = {"abstained"}
# Per kind, the table shows these answer metrics (the JSON has them all).
_KIND_ANSWER_ROWS = ("key_fact_recall", "citation_precision", "abstained")


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def render_markdown(report: EvalReport, source: str | None = None, misses: bool = False) -> str:
    """One table: a row per (kind, metric), a column per mode; the best value of a row in bold.

    When the figures have intervals (`evaluate(ci=True)`), each value is followed by its 95% interval.
    With `misses`, a line per mode lists the questions whose first gold paper is not ranked first.
    """
    modes = list(report.modes)
    kinds = list(report.kinds)
    counts = ", ".join(f"{kind} {count.questions}" for kind, count in report.kinds.items())
    first = next(iter(report.modes.values()))
    lines = [f"{source + ': ' if source else ''}{report.questions} questions ({counts}); "
             f"retrieval top {report.retrieval_k}"
             + (f", answers: {first.answerer or '?'} at k={report.answer_k}"
                if first.answers is not None else ", answers not evaluated") + ".", ""]
    lines.append("| kind | metric | " + " | ".join(modes) + " |")
    lines.append("|---|---|" + "---:|" * len(modes))
    for group in [*kinds, OVERALL]:
        n = report.questions if group == OVERALL else report.kinds[group].questions
        rows: list[tuple[str, list[str]]] = []
        sections: tuple[tuple[Section, Sequence[str]], ...] = (
            ("retrieval", RETRIEVAL_METRICS),
            ("answers", OVERALL_ANSWER_METRICS if group == OVERALL else _KIND_ANSWER_ROWS))
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
                cells = [f"{c} [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else c for c, iv in zip(cells, intervals)]
                rows.append((_LABELS.get(name, name), cells))
        for i, (label, cells) in enumerate(rows):
            head = f"{group} ({n})" if i == 0 else ""
            lines.append(f"| {head} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Retrieval metrics average the {report.with_gold} questions with gold papers; MRR counts the "
                 "first gold paper in the top 10; nDCG uses binary relevance.")
    if first.answers is not None:
        lines.append("Key-fact recall: share of a question's key facts found in its answer (case-insensitive, "
                     "LaTeX markup stripped). Citation precision: share of cited papers that are gold, averaged "
                     "over the answers to answerable questions that cite something. Abstained: share of the "
                     "kind's questions answered with an abstention. Abstention precision/recall: abstaining as "
                     "a detector of the empty-gold questions. Supported citations: share of all citations "
                     "marked supported.")
    if any(info.ci for info in report.modes.values()):
        lines.append("[low, high]: 95% interval over the questions: Wilson score interval where every question "
                     "scores 0 or 1 (hit@k, shares of questions), percentile bootstrap "
                     f"({BOOTSTRAP_SAMPLES} resamples) for the rest.")
    timing = ", ".join(f"{m} {info.seconds:.1f} s" for m, info in report.modes.items())
    lines.append(f"Time: {timing}.")
    if misses:
        lines += ["", "Misses at hit@1 (question id: rank of its first gold paper, - when not in the top "
                  f"{report.retrieval_k}):", ""]
        for mode, info in report.modes.items():
            missed = [f"{q.id}: {q.gold_rank or '-'}" for q in info.questions if q.gold and q.gold_rank != 1]
            lines.append(f"- {mode}: " + (", ".join(missed) if missed else "none"))
    return "\n".join(lines) + "\n"
