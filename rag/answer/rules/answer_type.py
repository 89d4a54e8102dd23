"""What kind of answer a question asks for, and whether an answer's text gives one.

"How many times faster is ePC than sPC?" asks for a number and "which benchmarks was A-MemGuard
evaluated on?" for names. The local model answers such near misses with true sentences that do not
hold the detail ("runs orders of magnitude faster", "evaluated on multiple benchmarks") and names
them as its evidence; none of the model's own signals told those apart from answers
(docs/lab/answers-history.md). The expected answer's type does: a reply to a number question with no
number in it, or to a names question with no name the question did not already hold, does not state
what was asked. Nor does one whose number or name comes only from another paper than the one asked
about (`from_another_paper`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from rag.index.keyword import name_like_words
from rag.text import STOPWORDS

AnswerType = Literal["number", "names"]

# The question's own verb decides: "why do ... fail when each query has a cap on how many tokens
# ..." asks for a reason, not a number.
_ASKS_OTHER = re.compile(
    r"\s*(?:why|how (?:does|do|did|can|could|is|are|was|were|should|would))\b", re.I
)
_ASKS_NUMBER = re.compile(
    r"\bhow (?:many|much|fast|large|big|high|low|long|often|accurate)\b|\bhow \w+ times\b|\bby how"
    r" much\b"
    r"|\bwhat (?:\w+"
    r" ){0,2}?(?:percentage|fraction|proportion|ratio|accuracy|score|rate|speed-?up|sizes?|number|"
    r"value|psnr|f1|auc|bleu)\b|\bnumbers?(?: please)?\s*\??\s*$",
    re.I,
)
# "which agent benchmarks", "what base LLM", "which vision-only model": the kind of thing named
# follows the wh-word within a few words, none of them a verb ("which groups did the models
# misclassify" asks for groups).
_ASKS_NAMES = re.compile(
    r"\b(?:which|what)\s+(?:(?!(?:did|does|do|is|are|was|were|has|have|had|the|a|an)\b)[\w-]+,?\s+){0,5}?"
    r"(?:benchmarks?|datasets?|models?|llms?|vlms?|baselines?|backbones?|architectures?|environments?|games?)\b",
    re.I,
)
_LIST_QUESTION = re.compile(r"\b(?:which|what)\s+(?:papers?|works?|studies|methods)\b", re.I)
# "which kinds of models does it cover?" asks for categories ("dense retrievers, rerankers"), not
# names.
_ASKS_KINDS = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(?:kinds?|types?|sorts?|classes|categories|famil(?:y|ies))\s+of\b",
    re.I,
)
_NUMBER_WORDS = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    " sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty hundred thousand million"
    " billion dozen twice half double triple single zero".split()
)
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
_MARKER = re.compile(r"\[\d+(?:\s*[,;]\s*\d+)*\]")
_WORD = re.compile(r"[A-Za-z0-9][\w'’+-]*")
_CLAUSE = re.compile(r"[,.;:?!()/]+|\s-\s")
# "Conflict-Aware Adaptive Margin Preference Alignment (CAMP)": up to seven words, then the acronym
# in brackets.
_DEFINITION = re.compile(r"(?<![\w'’+-])((?:[\w'’+-]{1,60}\s+){1,7}?)\(([A-Za-z][\w+-]{0,60})\)")
# "A-MemGuard (Agent-Memory Guard)": a name, then what it stands for in brackets. (Words are
# separated by required spaces: with optional ones a long word after an unclosed bracket backtracks
# for minutes; and a word starts after no word character and is at most 60 long, so that a run of
# 90,000 characters without a space is read once, not from each of its characters.)
_SPELLED_OUT = re.compile(
    r"(?<![\w+-])([A-Za-z][\w+-]{0,60})\s+\(([\w'’+-]{1,60}(?:\s+[\w'’+-]{1,60}){0,6})\s*\)"
)
# Words written like names that name no particular thing: a question asking which LLM is not
# answered by "LLM". Nor are the capitalised words of mathematics ("Bayesian metaplasticity" names
# no benchmark).
_GENERIC_NAMES = frozenset(
    w.lower()
    for w in (
        "LLM LLMs VLM VLMs VFM VFMs MLLM MLLMs LM LMs AI ML RL NLP GPU GPUs SOTA DNN DNNs CNN CNNs "
        "GNN GNNs Bayesian Gaussian Markov Markovian Euclidean Riemannian Lipschitz Hessian Fisher "
        "Monte Carlo Boltzmann Langevin Laplace Laplacian Shapley Nash Stackelberg Pareto "
        "Transformer Transformers Wasserstein Kullback Leibler Bernoulli Poisson Newton "
        "Hamiltonian Lagrangian Fourier Kalman Hilbert Jacobian Dirichlet Bellman Nesterov Bregman "
        "Gibbs Kronecker Hopfield Gumbel Softmax Boolean Turing English"
    ).split()
)


def asked_type(question: str) -> AnswerType | None:
    """ "number", "names", or None when the question asks for something else (a reason, a method,
    a list of papers)."""
    if _ASKS_OTHER.match(question) or _LIST_QUESTION.search(question):
        return None
    if _ASKS_NUMBER.search(question):
        return "number"
    if _ASKS_NAMES.search(question) and not _ASKS_KINDS.search(question):
        return "names"
    return None


# A quantity written in mathematics ("at least k memory blocks", "𝒪̃((α⁻¹ + ε⁻¹)/γ²) queries") is
# the number a theory paper gives: a lone letter other than a/I (not one of an "S&D"), a Greek
# letter, a super- or subscript. Not a bare big-O: "𝒪(√(KT)) regret" says how regret grows, not how
# much faster a method runs.
_MATH_QUANTITY = re.compile(r"(?<![\w'’&/-])(?![aAI]\b)[A-Za-z](?![\w'’&/-])|[\u0370-\u03ff⁰-₟]")


# "e.g." and "i.e." are no mathematics: their letters are not quantities.
_LATIN = re.compile(r"\b(?:e\.\s?g|i\.\s?e|cf|vs|et al)\.", re.I)
# "no additional forward passes" answers "how many extra forward passes?": zero.
_NONE_EXTRA = re.compile(r"\b(?:no|without(?: any)?)\s+(?:additional|extra)\b", re.I)


def _numbers(text: str) -> set[str]:
    text = _NONE_EXTRA.sub(" zero ", _LATIN.sub(" ", text))
    return (
        set(_DIGITS.findall(text))
        | set(_MATH_QUANTITY.findall(text))
        | {w for w in re.findall(r"[a-z]+", text.lower()) if w in _NUMBER_WORDS}
    )


def _question_words(question: str) -> set[str]:
    """The question's words, hyphenated ones also in parts ("LRM-traces" holds LRM), and the
    acronym of each run of its capitalised words ("Neural Concept Verifier" holds NCV)."""
    words = re.findall(r"[\w-]+", question)
    out = {w.lower() for w in words} | {p.lower() for w in words for p in w.split("-") if p}
    run: list[str] = []
    for word in [*words, ""]:
        if word[:1].isupper():
            run.append(word)
            continue
        for i in range(len(run)):
            for j in range(i + 2, len(run) + 1):
                out.add("".join(w[0] for w in run[i:j]).lower())
        run = []
    return out


def _acronym_letters(word: str) -> str:
    """An acronym's capitals ("HtFL" -> "hfl"), or "" for a word that is not mostly capitals
    ("DeepSeek")."""
    caps = "".join(c for c in word if c.isupper())
    return caps.lower() if len(caps) >= 2 and 2 * len(caps) >= len(word.rstrip("s")) else ""


def _initials(words: list[str]) -> str:
    # An acronym inside a run keeps its letters: "heterogeneous FL" is HFL (HtFL).
    return "".join(w.lower() if w.isupper() and len(w) <= 5 else w[0].lower() for w in words)


def _question_acronyms(question: str) -> set[str]:
    """The initials of every run of two to six of the question's words, in any case, within a
    clause: "policy gradient" is PG, "neural concept verifier" NCV."""
    out: set[str] = set()
    for clause in _CLAUSE.split(question):
        words = [
            p
            for w in _WORD.findall(clause)
            for p in w.split("-")
            if p and p.lower() not in STOPWORDS
        ]
        for i in range(len(words)):
            out.update(_initials(words[i:j]) for j in range(i + 2, min(len(words), i + 6) + 1))
    return out


def _subject_names(question: str, texts: list[str]) -> set[str]:
    """Words the answer's texts define as the question's own subject: "Conflict-Aware Adaptive
    Margin Preference Alignment (CAMP)" or "CAMP (Conflict-Aware ...)" when the question says
    CAMP, "Recommender systems (RS)" when at least half of the definition's words begin as the
    question's do, and the words of a generic one ("Large Language Models (LLMs)"). Both the
    acronym and the words of its definition are the subject, not an answer."""
    asked = _question_words(question)
    starts = {p.lower()[:6] for w in _WORD.findall(question) for p in [w, *w.split("-")] if p}
    out: set[str] = set()
    for text in texts:
        for m in _DEFINITION.finditer(text):
            acronym, before = m.group(2), _WORD.findall(m.group(1))
            letters = _acronym_letters(acronym) or acronym.lower()
            # The definition: the shortest run of the words before "(ACR)" that starts with its
            # first letter and spells it, or has as many words as it has letters.
            run: list[str] = []
            for k in range(1, min(len(before), len(letters) + 3) + 1):
                if before[-k][0].lower() != letters[0]:
                    continue
                run = before[-k:]
                content = [p for w in run if w.lower() not in STOPWORDS for p in w.split("-") if p]
                if len(content) >= len(letters) or _initials(content) == letters:
                    break
            parts = [p for w in run if w.lower() not in STOPWORDS for p in w.split("-") if p]
            generic = _generic(acronym)
            if parts and (
                acronym.lower() in asked
                or generic
                or 2 * sum(p.lower()[:6] in starts for p in parts) >= len(parts)
            ):
                out.add(acronym.lower())
                out.update(w.lower() for w in run)
                out.update(p.lower() for p in parts)
        # The other way round, "A-MemGuard (Agent-Memory Guard)": the words in brackets spell out a
        # name the question holds.
        for m in _SPELLED_OUT.finditer(text):
            if m.group(1).lower() in asked:
                words = _WORD.findall(m.group(2))
                out.update(w.lower() for w in words)
                out.update(p.lower() for w in words for p in w.split("-") if p)
    return out


def _new_names(question: str, lines: list[str], sources: list[str]) -> list[str]:
    """The names in `lines` that the question does not already hold: not its words, their parts
    ("Guard" of A-MemGuard), the acronyms of its words, generic words, or what the texts define
    as its subject."""
    asked = _question_words(question)
    acronyms = _question_acronyms(question)
    subject = _subject_names(question, [*lines, *sources])
    new = []
    for line in lines:
        for word in name_like_words(line):
            low = word.lower()
            if (
                low in asked
                or low in _GENERIC_NAMES
                or word.isdigit()
                or low in subject
                or _acronym_letters(word) in acronyms
                or (len(low) >= 4 and any(low in q for q in asked))
            ):
                continue
            new.append(word)
    return new


def gives_asked_type(question: str, text: str, sources: Sequence[str] = ()) -> bool:
    """Whether `text` (an answer: its synthesis and quotes) holds an answer of the type
    `question` asks for that the question did not already hold: a number for a number question, a
    name for a names question. `sources` (the abstracts the answer draws on) tell which names
    define the question's own subject ("the neural concept verifier" is NCV). True for questions
    that ask for neither."""
    kind = asked_type(question)
    if kind is None:
        return True
    lines = [re.sub(r"^\s*[-*]\s+", "", line) for line in _MARKER.sub(" ", text).splitlines()]
    if kind == "number":
        return bool(_numbers(" ".join(lines)) - _numbers(question))
    return bool(_new_names(question, lines, list(sources)))


# A source whose passage matches the question's words (BM25) under this share of the best source's
# is not the paper the question asks about. Set from the answered near misses of
# eval/answer_type_questions.jsonl (their borrowed figure's source: 0.09-0.27 of the best) and its
# answered questions (0.82-1.00).
SUBJECT_SHARE = 0.5


def from_another_paper(
    question: str,
    pieces: list[tuple[int, str]],
    keyword_scores: dict[int, float],
    sources: Sequence[str] = (),
) -> bool:
    """Whether the number or names the question asks for come only from sources far less about
    the question than the best one: "training with honeypots: by how much did harmful failures
    drop?" answered with another paper's "cuts attack success rates by over 95%". `pieces` are
    the answer's sentences and quotes with the source each cites; `keyword_scores` each source's
    BM25 for the question."""
    if asked_type(question) is None or not any(keyword_scores.values()):
        return False
    giving = {n for n, text in pieces if gives_asked_type(question, text, sources)}
    return bool(giving) and not giving & set(on_subject(keyword_scores))


def on_subject(keyword_scores: dict[int, float]) -> list[int]:
    """The sources about what the question asks: BM25 for it at least SUBJECT_SHARE of the best
    source's."""
    best = max(keyword_scores.values(), default=0.0)
    return [n for n, score in keyword_scores.items() if score >= SUBJECT_SHARE * best]


def unwritten_names(question: str, cited: Sequence[str]) -> list[str]:
    """The names the question asks about (rag/answer/rules/topic.py's `missing_names`:
    "ResNet-50", "COCO", "Qwen2.5-VL") that none of the `cited` texts (the titles and abstracts
    of the papers an answer cites) writes, leaving out words that name no particular thing
    ("LLMs", "Bayesian") and acronyms a text spells out ("ICL" for "in-context learning"). An
    answer citing only papers that never mention what the question names is about something else:
    "what top-1 accuracy did ResNet-50 reach on ImageNet?" answered with a DeiT's figure on
    ImageNet, "which base model did DeFacto train, Qwen2.5-VL?" with DeFacto's sentence that
    names none."""
    from rag.answer.rules.topic import missing_names

    names = [n for n in missing_names(question, list(cited)) if not _generic(n)]
    if not names:
        return []
    initials = _run_initials(cited)
    names = [n for n in names if re.sub(r"[^a-z]", "", n.lower()).removesuffix("s") not in initials]
    # Said once: "ResNet-50", not "ResNet-50" or "ResNet" (the question's "original ResNet paper").
    return [
        n for n in names if not any(n.lower() in other.lower() and n != other for other in names)
    ]


def _generic(name: str) -> bool:
    """A name of nothing in particular ("LLMs", "Bayesian"), in the singular or the plural."""
    return name.lower() in _GENERIC_NAMES or name.lower().rstrip("s") in _GENERIC_NAMES


def _run_initials(texts: Sequence[str], longest: int = 6) -> set[str]:
    """The initials of every run of two to `longest` words of `texts`, hyphenated parts as words
    and stopwords included ("in-context learning" is ICL, "mixture of experts" MoE)."""
    out: set[str] = set()
    for text in texts:
        for clause in _CLAUSE.split(text):
            words = [p for w in _WORD.findall(clause) for p in w.split("-") if p and p[0].isalpha()]
            for i in range(len(words)):
                letters = ""
                for word in words[i : i + longest]:
                    letters += word[0].lower()
                    if len(letters) >= 2:
                        out.add(letters)
    return out
