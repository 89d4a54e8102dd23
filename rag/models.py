"""The data the engine returns: `Answer`, `Source`, `Citation`, and `AnswerStream` (an `Answer` as
it streams).

Citations are data, not formatting: `Answer.answer` carries `[n]` markers, and
`citations`/`sources` say which paper each `n` is. The JSON shape is fixed by
the contract (`rag ask --json`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field


class RetrievalScores(BaseModel):
    """What a source's place in the results is made of. Results are listed by `rank`, which follows
    `fused`; `cosine` and `keyword` are the two matches fused, each labelled, and need not fall with
    the rank (a passage can share the query's rare words yet be further in meaning)."""

    rank: int = Field(
        description="Place in the retrieval order, 1 = the best match: results are listed by it."
    )
    fused: float = Field(
        description="The score the order follows, 0..1 (1: first in every list fused): the "
        "reciprocal rank fusion of the keyword and meaning rankings (hybrid, hybrid-rrf), a "
        "blend of their scaled scores (hybrid-convex), or the rank in the one list (bm25, dense)."
    )
    cosine: float | None = Field(
        description="Meaning match: the cosine similarity of the query to the passage "
        "shown (null when the vectors cannot be read)."
    )
    keyword: float = Field(
        description="Keyword match: the BM25 score of the passage shown for the query's words "
        "(0: no word in common; unbounded, comparable within one query only)."
    )

    def label(self) -> str:
        """The numbers in words a reader can tell apart: "fused 0.97 · cosine 0.21 · keyword
        3.4"."""
        parts = [f"fused {self.fused:.2f}"]
        if self.cosine is not None:
            parts.append(f"cosine {self.cosine:.2f}")
        parts.append(f"keyword {self.keyword:.1f}")
        return " · ".join(parts)


class Source(BaseModel):
    """One retrieved paper, numbered as the answer refers to it."""

    n: int = Field(description="The marker number: [n] in the answer refers to this source.")
    paper_id: str = Field(description="Stable paper id (OpenReview id when known).")
    title: str = Field(description="Title, or a label derived from the abstract when unknown.")
    authors: list[str] = Field(default_factory=list, description="Author names, may be empty.")
    url: str | None = Field(default=None, description="Link to the paper, when known.")
    score: float = Field(
        description="Relevance in 0..1, higher is better: the cosine similarity of the query to "
        "the passage, whose meaning holds across queries (the fused score when the vectors "
        "cannot be read). Not what the results are sorted by: see `retrieval`."
    )
    passage: str = Field(description="The passage (chunk) of the abstract that was retrieved.")
    cited: bool = Field(default=False, description="Whether the answer cites this source.")
    # Not in the JSON (../shared/CONTRACT.md fixes a source's keys): there, `n` is the rank and
    # `score` the cosine.
    retrieval: RetrievalScores | None = Field(
        default=None,
        exclude=True,
        description="Its place in the retrieval order and the scores that make it (None "
        "for a source not made by retrieval); shown by the CLI and the UI.",
    )
    evidence: list[str] = Field(
        default_factory=list,
        exclude=True,
        description="Sentences of the passage that back the claims citing it.",
    )

    def scores_label(self) -> str:
        """Its numbers, each named: "fused 0.97 · cosine 0.21 · keyword 3.4" ("score 0.90" for a
        source that retrieval did not make). One wording for the CLI and the UI."""
        return self.retrieval.label() if self.retrieval is not None else f"score {self.score:.2f}"


class Citation(BaseModel):
    """One marker used in the answer."""

    n: int
    paper_id: str
    supported: bool | None = Field(
        default=None,
        description="Whether the cited passage supports the claim (None: not checked).",
    )


class Usage(BaseModel):
    """Token usage of the LLM call, when there was one."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = Field(
        default=False, description="Counted with tiktoken: the server reported no usage."
    )
    cost_usd: float | None = Field(
        default=None, description="Estimated cost for known OpenAI models."
    )


# What held an answer back: each label is a rule's in the table of rules,
# rag/answer/rules/__init__.py (tests/test_rules.py fails on a label no row sets).
AbstainedBy = Literal[
    "retrieval",
    "model",
    "check",
    "support",
    "filter",
    "evidence",
    "answer_type",
    "answer_source",
    "answer_names",
    "first_paper",
    "topic",
    "background",
]


class Answer(BaseModel):
    """A question, its answer with `[n]` markers, the citations and every retrieved source."""

    question: str
    answer: str
    mode: Literal["llm", "extractive"]
    outcome: Literal["answered", "not_stated", "not_covered"] = Field(
        default="answered",
        description=(
            "answered: cited claims; not_stated: the papers discuss the subject but do not state"
            " what was asked (the answer says so and quotes what they do say, cited); not_covered:"
            " a refusal, the nearest papers listed. Set to not_covered when an answer abstains"
            " without saying which."
        ),
    )
    abstained: bool = Field(
        default=False, description="True for the outcomes not_stated and not_covered."
    )
    grounding: float | None = Field(
        default=None, description="Share of cited sentences whose citations are supported (0..1)."
    )
    citations: list[Citation] = Field(default_factory=list)
    sources: list[Source] = Field(default_factory=list)
    usage: Usage | None = None
    error: str | None = Field(
        default=None, description="Why the LLM could not answer, if it failed."
    )
    # Diagnostics kept out of the JSON shape (fixed by the contract):
    uncited_sentences: list[str] = Field(
        default_factory=list,
        exclude=True,
        description="Claim sentences of the answer that cite nothing.",
    )
    abstained_by: AbstainedBy | None = Field(
        default=None,
        exclude=True,
        description=(
            "The rule that held the answer back: its label in the table of rules"
            " (rag/answer/rules/__init__.py; docs/answers.md lists them with what each does)."
        ),
    )
    withdrawn: str | None = Field(
        default=None,
        exclude=True,
        description=(
            "An answer streamed and then withdrawn: none of its citations is supported, or nothing "
            "cited is left once the injection filter has removed what it must."
        ),
    )
    filtered: list[str] = Field(
        default_factory=list,
        exclude=True,
        description=(
            "Sentences and links taken out of the answer: what only a source's instructions asked"
            " for."
        ),
    )
    answerable: float | None = Field(
        default=None,
        exclude=True,
        description=(
            "The model's probability that the sources answer the question (RAG_LLM_CHECK), when"
            " asked."
        ),
    )
    removed_markers: list[int] = Field(
        default_factory=list,
        exclude=True,
        description="Markers the model wrote that match no source (removed).",
    )

    def model_post_init(self, context: object, /) -> None:
        # The two fields say one thing: an abstention is not_covered unless it says it is
        # not_stated.
        if self.abstained and self.outcome == "answered":
            self.outcome = "not_covered"
        elif self.outcome != "answered":
            self.abstained = True

    @property
    def cited_sources(self) -> list[Source]:
        return [s for s in self.sources if s.cited]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class Reading(str):
    """The empty piece an answer stream gives first when a model answers: the sources are found and
    the model starts reading them. It equals "" (so it joins into the answer as nothing) and holds
    the papers the model reads (`papers`, in retrieval order: show them while it reads), their
    number (`sources`) and about how long the reading takes (`seconds`; None when not known)."""

    papers: list[Source]
    sources: int
    seconds: float | None

    def __new__(cls, papers: list[Source], seconds: float | None) -> Reading:
        piece = super().__new__(cls, "")
        piece.papers, piece.sources, piece.seconds = list(papers), len(papers), seconds
        return piece


class Writing(str):
    """An empty piece a stream gives while the model writes (`tokens` so far, counted in the
    pieces it streamed): its answer is shown once checked, whole, so nothing shown is taken back."""

    tokens: int

    def __new__(cls, tokens: int) -> Writing:
        piece = super().__new__(cls, "")
        piece.tokens = tokens
        return piece


class AnswerStream:
    """An answer as it is produced: iterating yields its text pieces (`str`), then `.answer` is the
    final `Answer`. Reading `.answer` before the pieces are all read reads the rest
    (`rag.stream(q).answer`).

    Nothing runs until it is first read, and an error (`InputError`, `StoreError`, ...) is raised
    from there: from the loop, or from `.answer` (again on each later read). One pass only: a second
    loop yields nothing more. Not for two threads at once.
    """

    def __init__(self, pieces: Generator[str, None, Answer]) -> None:
        self._pieces = pieces
        self._answer: Answer | None = None
        self._error: BaseException | None = None
        self._done = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        try:
            return next(self._pieces)
        except StopIteration as stop:
            self._done = True
            if not isinstance(stop.value, Answer):
                self._error = RuntimeError(
                    f"the answer stream ended without an Answer (got {stop.value!r})"
                )
            self._answer = stop.value
            raise StopIteration from None
        except BaseException as exc:
            self._done = True
            self._error = exc
            raise

    @property
    def done(self) -> bool:
        """Whether every piece has been read (or the stream failed)."""
        return self._done

    @property
    def answer(self) -> Answer:
        """The final `Answer`, once the rest of the pieces are read."""
        for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer

    def close(self) -> None:
        """Stop the answer where it is (e.g. a client went away); `.answer` then raises."""
        if not self._done:
            self._done = True
            self._error = RuntimeError("the answer stream was closed before it ended")
            self._pieces.close()


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass
class IngestReport:
    """What an ingest did: `RAG.ingest` returns it, `rag ingest` prints its `summary()`."""

    files: list[str] = field(default_factory=list)
    records: int = 0
    skipped_no_abstract: int = 0
    already_indexed: int = 0
    duplicates: int = 0  # the same id and abstract again within this ingest's input
    duplicate_example: str = ""  # "file:line repeats file:line", the first of them
    new_papers: int = 0
    new_chunks: int = 0

    @property
    def wrote_nothing(self) -> bool:
        return self.new_chunks == 0

    def summary(self) -> str:
        if self.wrote_nothing:
            head = "nothing new to index: every abstract is already in the index"
        else:
            head = (
                f"indexed {_plural(self.new_papers, 'new paper')}"
                f" ({_plural(self.new_chunks, 'chunk')})"
            )
        parts = [f"{_plural(self.records, 'record')} read from {_plural(len(self.files), 'file')}"]
        if self.already_indexed:
            parts.append(f"{self.already_indexed} already indexed")
        if self.duplicates:
            parts.append(
                f"{_plural(self.duplicates, 'duplicate')} within the input"
                f" ({self.duplicate_example})"
            )
        if self.skipped_no_abstract:
            parts.append(f"{self.skipped_no_abstract} skipped without an abstract")
        return f"{head}; " + ", ".join(parts)
