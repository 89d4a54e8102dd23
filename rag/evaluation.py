"""Evaluation: retrieval and answer metrics over a question set (`rag eval FILE.jsonl`).

Question file: one JSON object per line, `{id, question, gold: [paper ids], kind, key_facts?}`
(see `eval/README.md`). Retrieval metrics use the top 10 papers of `RAG.search` and are computed
over the questions with non-empty gold; answer metrics use `RAG.ask` with the configured answerer
(extractive without an LLM).

The metric functions at the top are pure: `ranked` is the list of retrieved paper ids, best first
(each paper once), `gold` the relevant ids. Relevance is binary.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
from collections import OrderedDict
from pathlib import Path

from .errors import InputError, RagError

RETRIEVAL_K = 10  # the contract: metrics at k=10 unless named
RETRIEVAL_METRICS = ("hit@1", "hit@5", "mrr", "recall@5", "recall@10", "ndcg@10")
ANSWER_METRICS = ("key_fact_recall", "citation_precision", "abstained", "supported_citations")
OVERALL_ANSWER_METRICS = ("key_fact_recall", "citation_precision", "abstention_precision",
                          "abstention_recall", "abstained", "supported_citations")
UNANSWERABLE_SUBKINDS = ("off-topic", "not-covered", "near-miss")  # the contract's, for empty-gold questions
KIND_ORDER = ("keyword", "paraphrase", "numeric", "multi", "unanswerable")
OVERALL = "overall"
# Resamples of the question set for the 95% intervals (`--ci`); fixed seed, so a rerun prints the same.
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


# ---- metric functions (pure) -----------------------------------------------------------------

def hit_at(ranked: list[str], gold, k: int) -> float:
    """1.0 when any gold paper is in the top k, else 0.0."""
    gold = set(gold)
    return 1.0 if any(p in gold for p in ranked[:k]) else 0.0


def mrr(ranked: list[str], gold, k: int = RETRIEVAL_K) -> float:
    """Reciprocal rank of the first gold paper within the top k (0.0 when there is none)."""
    gold = set(gold)
    for rank, p in enumerate(ranked[:k], 1):
        if p in gold:
            return 1.0 / rank
    return 0.0


def recall_at(ranked: list[str], gold, k: int) -> float:
    """Share of the gold papers found in the top k."""
    gold = set(gold)
    if not gold:
        raise ValueError("recall needs at least one gold paper")
    return len(gold & set(ranked[:k])) / len(gold)


def ndcg_at(ranked: list[str], gold, k: int = RETRIEVAL_K) -> float:
    """nDCG@k with binary relevance: DCG = sum over hits at rank r of 1/log2(r+1), over the ideal DCG."""
    gold = set(gold)
    if not gold:
        raise ValueError("nDCG needs at least one gold paper")
    dcg = sum(1.0 / math.log2(rank + 1) for rank, p in enumerate(ranked[:k], 1) if p in gold)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))
    return dcg / ideal


def retrieval_scores(ranked: list[str], gold) -> dict[str, float]:
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


def citation_precision(cited: list[str], gold) -> float | None:
    """Share of the cited papers that are gold; None when the answer cites nothing."""
    cited = list(dict.fromkeys(cited))
    if not cited:
        return None
    gold = set(gold)
    return sum(p in gold for p in cited) / len(cited)


def abstention_precision_recall(abstained: list[bool], unanswerable: list[bool]) -> tuple[float | None, float | None]:
    """(precision, recall) of abstaining as a detector of unanswerable questions.

    Precision: unanswerable among the abstentions (None when nothing abstained).
    Recall: abstentions among the unanswerable questions (None when there are none).
    """
    if len(abstained) != len(unanswerable):
        raise ValueError("abstained and unanswerable must have the same length")
    both = sum(a and u for a, u in zip(abstained, unanswerable))
    n_abstained, n_unanswerable = sum(abstained), sum(unanswerable)
    return (both / n_abstained if n_abstained else None, both / n_unanswerable if n_unanswerable else None)


def mean(values) -> float | None:
    """Arithmetic mean, skipping None; None when nothing is left."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def share(flags) -> float | None:
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags) if flags else None


# ---- question files --------------------------------------------------------------------------

def load_questions(path: str | Path) -> list[dict]:
    """Read and validate a question file. A bad line raises `InputError("file:line: what is wrong")`."""
    from .engine import clean_question

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
    questions: list[dict] = []
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
        for field in ("id", "question", "gold", "kind"):
            if field not in item:
                raise InputError(f"{where}: missing field {field!r}")
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
        questions.append({"id": qid, "question": question, "gold": gold, "kind": kind.strip(),
                          "key_facts": facts, "line": lineno, **({"subkind": subkind} if subkind else {})})
    if not questions:
        raise InputError(f"{path}: no questions")
    return questions


def missing_gold(rag, questions: list[dict]) -> dict[str, list[str]]:
    """Gold ids that are not in the index, by question id (they count as misses)."""
    wanted = sorted({g for q in questions for g in q["gold"]})
    present: set[str] = set()
    for start in range(0, len(wanted), 500):
        present.update(rag.store.papers(wanted[start:start + 500]))
    out = {q["id"]: [g for g in q["gold"] if g not in present] for q in questions}
    return {qid: ids for qid, ids in out.items() if ids}


# ---- running ---------------------------------------------------------------------------------

class _CachingEmbedder:
    """Remembers the vectors of texts already embedded (abstract sentences recur across questions).

    The extractive answerer embeds the sentences of the top papers for every question; in an
    evaluation the same few hundred sentences come back hundreds of times. Vectors do not depend
    on the batch a text is embedded in (checked: cosine > 0.9999998), so results are unchanged.
    """

    def __init__(self, inner, max_entries: int = 50_000) -> None:
        self._inner = inner
        self._cache: OrderedDict = OrderedDict()
        self._max = max_entries

    def __getattr__(self, name):
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
        return self.embed([text], truncate=True)[0]


def _with_cached_embeddings(rag):
    """A shallow copy of `rag` whose embedder caches vectors; the caller's object is left as it is."""
    if not hasattr(rag, "_embedder") or not hasattr(rag, "embedder"):
        return rag
    clone = copy.copy(rag)
    clone._embedder = _CachingEmbedder(rag.embedder)
    return clone


def _kinds_in_order(questions: list[dict]) -> list[str]:
    present = list(dict.fromkeys(q["kind"] for q in questions))
    return [k for k in KIND_ORDER if k in present] + [k for k in present if k not in KIND_ORDER]


def evaluate(rag, questions: list[dict], modes: list[str], k: int = 5, answers: bool = True,
             progress: bool = False, ci: bool = False) -> dict:
    """Run every question in every mode; return `{questions, kinds, modes: {mode: {...}}, ...}`.

    Retrieval: `rag.search(question, k=10, mode=mode)`, metrics per kind and overall over the
    questions with non-empty gold. Answers (when `answers`): `rag.ask(question, k=k, mode=mode)`
    with the configured answerer. A metric with nothing to average is None. Each mode also lists
    its `questions` (id, kind, gold, the ten papers retrieved, the rank of the first gold one) and, with
    `ci`, a 95% interval per metric (`ci95`, see `interval95`).
    """
    from .retrieval import check_k, check_mode

    modes = [check_mode(m) for m in dict.fromkeys(modes)]
    if not modes:
        raise InputError("no retrieval mode to evaluate")
    k = check_k(k)
    if not questions:
        raise InputError("no questions to evaluate")
    rag.ensure_index(progress=progress)
    missing = missing_gold(rag, questions)
    runner = _with_cached_embeddings(rag)
    kinds = _kinds_in_order(questions)
    result: dict = {
        "questions": len(questions),
        "kinds": {kind: {"questions": sum(q["kind"] == kind for q in questions),
                         "with_gold": sum(q["kind"] == kind and bool(q["gold"]) for q in questions),
                         "with_key_facts": sum(q["kind"] == kind and bool(q["key_facts"]) for q in questions)}
                  for kind in kinds},
        "retrieval_k": RETRIEVAL_K,
        "answer_k": k if answers else None,
        "missing_gold": missing,
        "modes": {},
    }
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(questions) * len(modes), desc="eval", unit="q", leave=False)
    try:
        for mode in modes:
            result["modes"][mode] = _evaluate_mode(runner, questions, kinds, mode, k, answers, bar, ci)
    finally:
        if bar is not None:
            bar.close()
    return result


def _evaluate_mode(rag, questions, kinds, mode, k, answers, bar, ci=False) -> dict:
    started = time.perf_counter()
    per_question = []
    for q in questions:
        ranked = [s.paper_id for s in rag.search(q["question"], k=RETRIEVAL_K, mode=mode)]
        gold = set(q["gold"])
        row = {"id": q["id"], "kind": q["kind"], "gold": q["gold"], "ranked": ranked,
               "gold_rank": next((i for i, p in enumerate(ranked, 1) if p in gold), None)}
        if gold:
            row["retrieval"] = retrieval_scores(ranked, q["gold"])
        if answers:
            ans = rag.ask(q["question"], k=k, mode=mode)
            cited = [s.paper_id for s in ans.sources if s.cited]
            row.update(
                abstained=bool(ans.abstained),
                answer_mode=ans.mode,
                error=ans.error,
                facts=key_fact_recall(ans.answer, q["key_facts"]) if q["key_facts"] else None,
                precision=citation_precision(cited, q["gold"]) if q["gold"] else None,
                supported=[c.supported is True for c in ans.citations],
            )
        per_question.append(row)
        if bar is not None:
            bar.update(1)
    out: dict = {"retrieval": {}, "answers": None}
    groups = {kind: [r for r in per_question if r["kind"] == kind] for kind in kinds}
    groups[OVERALL] = per_question
    for name, rows in groups.items():
        scored = [r["retrieval"] for r in rows if "retrieval" in r]
        if scored:
            out["retrieval"][name] = {m: mean(s[m] for s in scored) for m in RETRIEVAL_METRICS}
    if answers:
        out["answers"] = {}
        for name, rows in groups.items():
            metrics = {
                "key_fact_recall": mean(r["facts"] for r in rows),
                "citation_precision": mean(r["precision"] for r in rows),
                "abstained": share(r["abstained"] for r in rows),
                "supported_citations": share(s for r in rows for s in r["supported"]),
            }
            if name == OVERALL:
                p, rc = abstention_precision_recall([r["abstained"] for r in rows], [not r["gold"] for r in rows])
                metrics = {"key_fact_recall": metrics["key_fact_recall"],
                           "citation_precision": metrics["citation_precision"],
                           "abstention_precision": p, "abstention_recall": rc,
                           "abstained": metrics["abstained"],
                           "supported_citations": metrics["supported_citations"]}
            out["answers"][name] = metrics
        answer_modes = sorted({r["answer_mode"] for r in per_question})
        out["answerer"] = answer_modes[0] if len(answer_modes) == 1 else "+".join(answer_modes)
        out["answer_errors"] = sum(1 for r in per_question if r["error"])
    if ci:
        out["ci95"] = {}
        for section in ("retrieval", "answers"):
            for group, metrics in (out.get(section) or {}).items():
                out["ci95"].setdefault(section, {})[group] = {
                    name: interval95(*metric_parts(groups[group], section, name)) for name in metrics}
    out["questions"] = [{key: r[key] for key in ("id", "kind", "gold", "ranked", "gold_rank", "abstained") if key in r}
                        for r in per_question]
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


# ---- uncertainty -----------------------------------------------------------------------------

def metric_parts(rows: list[dict], section: str, name: str) -> tuple[list[float], list[float]]:
    """Per-question (numerator, denominator) lists whose sums' ratio is the metric over `rows`.

    Every metric of the tables is such a ratio: a mean is the sum of the values over the count of
    questions that have one (a question without a value adds 0 / 0), a share of citations or of
    abstentions sums counts. Resampling questions and recomputing the ratio gives its interval.
    """
    def pair(value):
        return (0.0, 0.0) if value is None else (float(value), 1.0)

    if section == "retrieval":
        pairs = [pair(r["retrieval"][name]) if "retrieval" in r else (0.0, 0.0) for r in rows]
    elif name in ("key_fact_recall", "citation_precision"):
        pairs = [pair(r["facts" if name == "key_fact_recall" else "precision"]) for r in rows]
    elif name == "abstained":
        pairs = [pair(r["abstained"]) for r in rows]
    elif name == "supported_citations":
        pairs = [(float(sum(r["supported"])), float(len(r["supported"]))) for r in rows]
    elif name == "abstention_precision":
        pairs = [(float(r["abstained"] and not r["gold"]), float(r["abstained"])) for r in rows]
    elif name == "abstention_recall":
        pairs = [(float(r["abstained"] and not r["gold"]), float(not r["gold"])) for r in rows]
    else:
        raise ValueError(f"unknown metric {name!r}")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def interval95(numerators, denominators, samples: int = BOOTSTRAP_SAMPLES,
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


def _dig(node, *keys):
    """node[k1][k2]...; None where a level is missing or None (a mode without answers or intervals)."""
    for key in keys:
        node = (node or {}).get(key)
    return node


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def render_markdown(result: dict, source: str | None = None, misses: bool = False) -> str:
    """One table: a row per (kind, metric), a column per mode; the best value of a row in bold.

    When the result has intervals (`evaluate(ci=True)`), each value is followed by its 95% interval.
    With `misses`, a line per mode lists the questions whose first gold paper is not ranked first.
    """
    modes = list(result["modes"])
    kinds = list(result["kinds"])
    counts = ", ".join(f"{kind} {info['questions']}" for kind, info in result["kinds"].items())
    first = next(iter(result["modes"].values()))
    lines = [f"{source + ': ' if source else ''}{result['questions']} questions ({counts}); "
             f"retrieval top {result['retrieval_k']}"
             + (f", answers: {first.get('answerer', '?')} at k={result['answer_k']}"
                if first.get("answers") is not None else ", answers not evaluated") + ".", ""]
    lines.append("| kind | metric | " + " | ".join(modes) + " |")
    lines.append("|---|---|" + "---:|" * len(modes))
    for group in [*kinds, OVERALL]:
        if group == OVERALL:
            n = result["questions"]
        else:
            n = result["kinds"][group]["questions"]
        rows = []
        for section, names in (("retrieval", RETRIEVAL_METRICS),
                               ("answers", OVERALL_ANSWER_METRICS if group == OVERALL else _KIND_ANSWER_ROWS)):
            for name in names:
                values = [_dig(result["modes"][m], section, group, name) for m in modes]
                if all(v is None for v in values):
                    continue
                cells = [_fmt(v) for v in values]
                known = [v for v in values if v is not None]
                if len(modes) > 1 and name not in _NOT_RANKED and len(set(known)) > 1:
                    best = max(known)
                    cells = [f"**{c}**" if v == best else c for c, v in zip(cells, values)]
                intervals = [_dig(result["modes"][m], "ci95", section, group, name) for m in modes]
                cells = [f"{c} [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else c for c, iv in zip(cells, intervals)]
                rows.append((_LABELS.get(name, name), cells))
        for i, (label, cells) in enumerate(rows):
            head = f"{group} ({n})" if i == 0 else ""
            lines.append(f"| {head} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    with_gold = sum(info["with_gold"] for info in result["kinds"].values())
    lines.append(f"Retrieval metrics average the {with_gold} questions with gold papers; MRR counts the first "
                 "gold paper in the top 10; nDCG uses binary relevance.")
    if first.get("answers") is not None:
        lines.append("Key-fact recall: share of a question's key facts found in its answer (case-insensitive, "
                     "LaTeX markup stripped). Citation precision: share of cited papers that are gold, averaged "
                     "over the answers to answerable questions that cite something. Abstained: share of the "
                     "kind's questions answered with an abstention. Abstention precision/recall: abstaining as "
                     "a detector of the empty-gold questions. Supported citations: share of all citations "
                     "marked supported.")
    if any("ci95" in info for info in result["modes"].values()):
        lines.append("[low, high]: 95% interval over the questions: Wilson score interval where every question "
                     "scores 0 or 1 (hit@k, shares of questions), percentile bootstrap "
                     f"({BOOTSTRAP_SAMPLES} resamples) for the rest.")
    timing = ", ".join(f"{m} {info['seconds']:.1f} s" for m, info in result["modes"].items())
    lines.append(f"Time: {timing}.")
    if misses:
        lines += ["", "Misses at hit@1 (question id: rank of its first gold paper, - when not in the top "
                  f"{result['retrieval_k']}):", ""]
        for mode, info in result["modes"].items():
            missed = [f"{q['id']}: {q['gold_rank'] or '-'}" for q in info.get("questions", [])
                      if q["gold"] and q["gold_rank"] != 1]
            lines.append(f"- {mode}: " + (", ".join(missed) if missed else "none"))
    return "\n".join(lines) + "\n"
