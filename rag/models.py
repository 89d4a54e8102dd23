"""The data the engine returns: `Answer`, `Source`, `Citation`.

Citations are data, not formatting: `Answer.answer` carries `[n]` markers, and
`citations`/`sources` say which paper each `n` is. The JSON shape is fixed by
the contract (`rag ask --json`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Source(BaseModel):
    """One retrieved paper, numbered as the answer refers to it."""

    n: int = Field(description="The marker number: [n] in the answer refers to this source.")
    paper_id: str = Field(description="Stable paper id (OpenReview id when known).")
    title: str = Field(description="Title, or a label derived from the abstract when unknown.")
    authors: list[str] = Field(default_factory=list, description="Author names, may be empty.")
    url: str | None = Field(default=None, description="Link to the paper, when known.")
    score: float = Field(description="Retrieval relevance in 0..1, higher is better.")
    passage: str = Field(description="The passage (chunk) of the abstract that was retrieved.")
    cited: bool = Field(default=False, description="Whether the answer cites this source.")
    evidence: list[str] = Field(default_factory=list, exclude=True,
                                description="Sentences of the passage that back the claims citing it.")


class Citation(BaseModel):
    """One marker used in the answer."""

    n: int
    paper_id: str
    supported: bool | None = Field(
        default=None, description="Whether the cited passage supports the claim (None: not checked)."
    )


class Usage(BaseModel):
    """Token usage of the LLM call, when there was one."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = Field(default=False, description="Counted with tiktoken: the server reported no usage.")
    cost_usd: float | None = Field(default=None, description="Estimated cost for known OpenAI models.")


class Answer(BaseModel):
    """A question, its answer with `[n]` markers, the citations and every retrieved source."""

    question: str
    answer: str
    mode: Literal["llm", "extractive"]
    abstained: bool = False
    grounding: float | None = Field(
        default=None, description="Share of cited sentences whose citations are supported (0..1)."
    )
    citations: list[Citation] = Field(default_factory=list)
    sources: list[Source] = Field(default_factory=list)
    usage: Usage | None = None
    error: str | None = Field(default=None, description="Why the LLM could not answer, if it failed.")
    # Diagnostics kept out of the JSON shape (fixed by the contract):
    uncited_sentences: list[str] = Field(default_factory=list, exclude=True,
                                         description="Claim sentences of the answer that cite nothing.")
    abstained_by: Literal["retrieval", "model", "check", "support", "filter"] | None = Field(
        default=None, exclude=True,
        description="What decided to abstain: the retrieval rule (nothing close, or an unknown name), the "
        "model's refusal, the answerability check before the answer, the support check after it, or the "
        "injection filter (nothing cited was left once what a source's instructions asked for was removed).")
    withdrawn: str | None = Field(
        default=None, exclude=True,
        description="An answer streamed and then withdrawn: none of its citations is supported, or nothing "
        "cited is left once the injection filter has removed what it must.")
    filtered: list[str] = Field(
        default_factory=list, exclude=True,
        description="Sentences and links taken out of the answer: what only a source's instructions asked for.")
    answerable: float | None = Field(
        default=None, exclude=True,
        description="The model's probability that the sources answer the question (RAG_LLM_CHECK), when asked.")
    removed_markers: list[int] = Field(default_factory=list, exclude=True,
                                       description="Markers the model wrote that match no source (removed).")

    @property
    def cited_sources(self) -> list[Source]:
        return [s for s in self.sources if s.cited]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)
