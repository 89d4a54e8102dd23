"""The engine: `RAG` ties store, retrieval and answering together; CLI, UI and apps sit on it."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from . import prompts
from .citations import escape_quote, renumber_sources, split_sentences
from .config import MAX_QUESTION_CHARS, Settings, embed_model_known
from .corpus import clean_field
from .errors import InputError, RagError
from .injection import instruction_sentences
from .models import Answer, Citation, Source
from .retrieval import Hit, check_k, check_mode, search
from .store import CORPUS_PENDING, SCHEMA_VERSION, Store

if TYPE_CHECKING:
    from .ingest import IngestReport

_SURROGATE = re.compile("[\ud800-\udfff]")
# Sentences that say where the code is, not what the paper found.
_BOILERPLATE = re.compile(r"https?://|github\.com|\b(?:code|data|dataset|models?) (?:is|are) (?:publicly )?(?:available|released)", re.I)
_FOLLOW_UP = re.compile(r"\b(it|its|they|their|them|this|that|these|those|the paper|the method|same)\b", re.I)


def clean_question(question) -> str:
    """Validate a question: text, not blank, not over-long; control characters become spaces."""
    if not isinstance(question, str):
        raise InputError(f"the question must be text, got {type(question).__name__}")
    text = " ".join(clean_field(question).split())
    if _SURROGATE.search(text):
        # A lone surrogate is what Python makes of bytes that are not UTF-8 (a terminal in another
        # encoding); it cannot be embedded or stored.
        raise InputError("the question holds bytes that are not UTF-8 text; retype it in a UTF-8 terminal "
                         "(set LANG to a UTF-8 locale, e.g. C.UTF-8)")
    if not text:
        raise InputError("the question is empty; type a question about the indexed papers")
    if len(text) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(text)} characters long; keep it under {MAX_QUESTION_CHARS}")
    return text


class RAG:
    """Paper Q&A over one index. Safe to share between threads.

    `RAG(settings=None, **overrides)`: overrides are `Settings` fields (e.g. `store_dir=...`, `top_k=8`).
    """

    def __init__(self, settings: Settings | None = None, **overrides) -> None:
        unknown = [name for name in overrides if name not in Settings.model_fields]
        if unknown:  # Settings ignores unknown names (.env may hold others): a typo here must not be
            import difflib

            close = difflib.get_close_matches(unknown[0], list(Settings.model_fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; see rag.Settings for the fields"
            raise InputError(f"unknown setting {unknown[0]!r}{hint}")
        try:
            if settings is None:
                settings = Settings(**overrides)
            elif overrides:
                settings = Settings(**{**settings.model_dump(), **overrides})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            raise InputError(f"invalid setting {field}: {err['msg']}") from None
        self.store = Store(settings)
        if "embed_model" not in settings.model_fields_set:
            # An index is queried with the model that built it unless RAG_EMBED_MODEL says otherwise.
            built_with = self.store.recorded_embedding_model()
            if built_with and built_with != settings.embed_model and embed_model_known(built_with):
                settings = settings.model_copy(update={"embed_model": built_with})
                self.store.settings = settings
        self.settings = settings
        self._embedder = None
        self._llm = None
        self._llm_ready = False
        self._lock = threading.RLock()

    # ---- parts -------------------------------------------------------------------------------

    @property
    def embedder(self):
        if self._embedder is None:
            from .providers import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    @property
    def llm(self):
        """The chat backend (OpenAI-compatible or local), or None when answers are extractive."""
        with self._lock:
            if not self._llm_ready:
                from .providers import make_llm

                self._llm = make_llm(self.settings)
                self._llm_ready = True
        return self._llm

    @property
    def retriever(self):
        """A LlamaIndex `BaseRetriever` (hybrid, one node per paper)."""
        from .retrieval import make_llamaindex_retriever

        return make_llamaindex_retriever(self)

    @property
    def query_engine(self):
        """A LlamaIndex `BaseQueryEngine`; its responses carry the `Answer` in `metadata['answer']`."""
        from .query_engine import make_query_engine

        return make_query_engine(self)

    # ---- index -------------------------------------------------------------------------------

    def ingest(self, paths: str | Path | list[str | Path] | None = None, rebuild: bool = False,
               include_corpus: bool | None = None, progress: bool = False) -> IngestReport:
        """Add corpus files to the index. The bundled `corpus/` goes in with no paths, into the default
        store while it is empty, or when `include_corpus` is True; never when it is False (a store of
        your own holds what you ingest). Returns an `IngestReport`."""
        from .ingest import index_records, pending_records, read_records
        from .providers import MINILM_MAX_TOKENS, ingest_embedder

        paths = _as_paths(paths)
        with self._lock, self.store.writer():
            empty = rebuild or self.store.paper_count() == 0
            # A first ingest killed before all of corpus/ was in leaves a store that is not empty
            # but still owes it: the flag makes the next ingest finish corpus/ too.
            owed = not rebuild and self.store.exists() and self.store.meta(CORPUS_PENDING) is not None
            if include_corpus is None:
                with_corpus = owed or not paths or (empty and self.settings.is_default_store)
            else:
                with_corpus = include_corpus
            if with_corpus:
                paths = [self.settings.corpus_dir, *paths]
            if not paths:
                raise InputError("nothing to ingest; pass corpus files or drop --no-corpus")
            records, report = read_records(paths)  # parse everything before touching the store
            if rebuild:
                self.store.clear()
            else:
                self.store.check_compatible(self.embedder.model_id)
            todo = pending_records(self.store, records, report)
            del records  # index_records empties `todo` once written, freeing the records' memory
            wrote = bool(todo)
            embedder = ingest_embedder(self.settings, self.embedder, len(todo)) if todo else self.embedder
            max_tokens = getattr(embedder, "max_tokens", None) or MINILM_MAX_TOKENS
            if with_corpus and wrote:
                self.store.set_meta(CORPUS_PENDING, "1")
            report = index_records(self.store, embedder, todo, report, self.settings.chunk_size,
                                   self.settings.chunk_overlap, max_tokens, progress)
            if with_corpus and (wrote or owed):
                self.store.set_meta(CORPUS_PENDING, None)
            return report

    @property
    def needs_build(self) -> bool:
        """Whether the first question will build the default store from `corpus/` (a one-time wait)."""
        return self.settings.is_default_store and self.store.paper_count() == 0

    def ensure_index(self, progress: bool = True) -> None:
        """Build the default store from `corpus/` the first time a question meets it empty; any other
        store must exist (see `Store.check_readable`)."""
        self.store.check_readable()
        if self.store.paper_count() == 0 and self.settings.is_default_store:
            with self._lock:
                if self.store.paper_count() == 0:
                    self.ingest(progress=progress)
        self.store.check_compatible(self.embedder.model_id)

    def stats(self) -> dict:
        self.store.check_readable()
        return {
            "papers": self.store.paper_count(),
            "chunks": self.store.chunk_count(),
            "embedding_model": self.store.meta("embedding_model") if self.store.exists() else None,
            "schema_version": int(self.store.meta("schema_version") or SCHEMA_VERSION) if self.store.exists()
            else SCHEMA_VERSION,
            "store": self.store.location,
        }

    # ---- retrieval ---------------------------------------------------------------------------

    def retrieve(self, query: str, k: int | None = None, mode: str | None = None) -> list[Hit]:
        query = clean_question(query)
        k = check_k(self.settings.top_k if k is None else k)
        mode = check_mode(self.settings.mode if mode is None else mode)
        self.ensure_index()
        return search(self.store, self.embedder, query, k, mode, self.settings)

    def search(self, query: str, k: int | None = None, mode: str | None = None) -> list[Source]:
        """Top-k papers for the query, each once with its best passage."""
        return [_source(i, h) for i, h in enumerate(self.retrieve(query, k, mode), 1)]

    # ---- answers -----------------------------------------------------------------------------

    def ask(self, question: str, k: int | None = None, mode: str | None = None, llm: bool = True,
            history: list[dict] | None = None) -> Answer:
        """Answer with numbered citations (LLM when configured and `llm`, else extractive)."""
        answer = None
        for piece in self.stream(question, k=k, mode=mode, llm=llm, history=history):
            if isinstance(piece, Answer):
                answer = piece
        assert answer is not None
        return answer

    def chat(self, message: str, history: list[dict] | None = None, **kwargs) -> Answer:
        """Answer a message in a conversation; follow-ups are rewritten into standalone questions."""
        return self.ask(message, history=history or [], **kwargs)

    def stream(self, question: str, k: int | None = None, mode: str | None = None, llm: bool = True,
               history: list[dict] | None = None) -> Iterator[str | Answer]:
        """Yield the answer text as it is produced, then the final `Answer`. With an LLM, an empty string
        comes first, once the sources are found and the model starts reading them."""
        question = clean_question(question)
        use_llm = llm and self.settings.llm_backend != "none"
        query = self.rewrite(question, history, use_llm) if history else question
        hits = self.retrieve(query, k, mode)
        sources = [_source(i, h) for i, h in enumerate(hits, 1)]
        if self._should_abstain(query, hits):
            answer = Answer(question=question, answer=prompts.ABSTAIN_ANSWER, abstained=True, abstained_by="retrieval",
                            mode="llm" if use_llm else "extractive", sources=sources)
            yield answer.answer
            yield answer
            return
        if not use_llm:
            answer = self._extractive(question, query, hits, sources)
            yield answer.answer
            yield answer
            return
        from .generate import generate

        # An empty piece: the sources are found and the model starts reading them, which takes seconds
        # on a CPU before its first word; the CLI and the UI show that they are waiting on it.
        yield ""
        yield from generate(self, question, query, hits, sources)

    def _should_abstain(self, query: str, hits: list[Hit]) -> bool:
        if not hits:
            return True
        sims = [h.similarity for h in hits if h.similarity is not None]
        best = max(sims) if sims else None
        # A question about something no indexed paper mentions ("How does FlashAttention tile ...?")
        # is about a paper that is not indexed, however close the papers on the same topic are, and
        # even when another word of it is a rare name some paper uses ("How far is Proxima Centauri
        # from Earth?" among papers of which one says "Earth").
        if best is None or best < self.settings.unknown_name_threshold:
            unknown = self.store.keyword_index().unknown_names(query)
            if any(not self.store.has_author_named(name) for name in unknown):
                return True
        if any(h.named for h in hits):
            return False
        return best is not None and best < self.settings.abstain_threshold

    def _extractive(self, question: str, query: str, hits: list[Hit], sources: list[Source],
                    error: str | None = None) -> Answer:
        """Quote the sentences of the top papers closest to the question, each with its [n]."""
        import numpy as np

        candidates: list[tuple[int, str]] = []
        for i, hit in enumerate(hits[:5], 1):
            # Never quote an instruction planted in an abstract (rag/injection.py), nor a sentence on code.
            dropped = instruction_sentences(hit.chunk.abstract)
            candidates.extend((i, s) for s, bad in list(zip(split_sentences(hit.chunk.abstract), dropped))[:12]
                              if len(s) > 30 and not bad and not _BOILERPLATE.search(s))
        if not candidates:
            return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, abstained=True,
                          mode="extractive", sources=sources, error=error)
        vectors = np.array(self.embedder.embed([s for _, s in candidates], truncate=True))
        q = np.array(self.embedder.embed_query(query))
        rank_bonus = {i: 0.05 * (len(hits) - i) / max(len(hits), 1) for i in range(1, len(hits) + 1)}
        scores = vectors @ q + np.array([rank_bonus[i] for i, _ in candidates])
        picked: list[tuple[int, str]] = []
        per_paper: dict[int, int] = {}
        best = float(scores.max())
        for j in np.argsort(-scores):
            i, sentence = candidates[j]
            if scores[j] < 0.6 * best or len(picked) >= 4:
                break
            if per_paper.get(i, 0) >= 2:
                continue
            per_paper[i] = per_paper.get(i, 0) + 1
            picked.append((i, sentence))
        # Numbered here, not by parsing the text: a bracket inside a quote ("W[1]-hard") is the
        # abstract's text, kept verbatim and escaped, never a citation.
        order = list(dict.fromkeys(i for i, _ in picked))
        text = "\n".join(f"- {escape_quote(s)} [{order.index(i) + 1}]" for i, s in picked)
        renumbered = renumber_sources(sources, order)
        label = prompts.EXTRACTIVE_LABEL if error is None else prompts.FALLBACK_LABEL
        # Quoted sentences support themselves: every citation is supported.
        citations = [Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in renumbered if s.cited]
        quoted = {s.paper_id: [q for i, q in picked if sources[i - 1].paper_id == s.paper_id] for s in renumbered}
        abstracts = {h.paper.paper_id: h.chunk.abstract for h in hits}
        # A quote may come from another chunk of the abstract than the one retrieved: the passage shown
        # for a citation is then the abstract, the text that holds it.
        renumbered = [s.model_copy(update={"evidence": quoted[s.paper_id]} | (
            {"passage": abstracts[s.paper_id]} if any(q not in s.passage for q in quoted[s.paper_id]) else {}))
            for s in renumbered]
        return Answer(question=question, answer=f"{label}\n{text}", mode="extractive",
                      citations=citations, sources=renumbered, grounding=1.0, error=error)

    def rewrite(self, message: str, history: list[dict] | None, use_llm: bool) -> str:
        """Turn a follow-up into a standalone question (LLM when there is one, a heuristic otherwise)."""
        turns = [t for t in (history or []) if isinstance(t, dict) and t.get("content")]
        user_turns = [str(t["content"]) for t in turns if t.get("role") == "user"]
        if not user_turns:
            return message
        if use_llm:
            from .generate import rewrite_with_llm

            try:
                return clean_question(rewrite_with_llm(self, message, turns) or message)
            except RagError:
                pass  # the heuristic below still gives a usable question
        if not _is_follow_up(message):
            return message
        # The topic is the latest user turn that was itself a standalone question.
        topic = next((t for t in reversed(user_turns) if not _is_follow_up(t)), user_turns[-1])
        return clean_question(f"{topic[:MAX_QUESTION_CHARS // 2]} {message}"[:MAX_QUESTION_CHARS])


def _is_follow_up(message: str) -> bool:
    # Short, and leaning on the conversation ("what about its results?"); a long question that
    # happens to say "the paper" stands on its own.
    words = len(message.split())
    return words <= 4 or (words <= 8 and bool(_FOLLOW_UP.search(message)))


def _as_paths(paths) -> list[Path]:
    """`ingest`'s paths: one path or a list of them (a bare string is one path, not its characters)."""
    if paths is None:
        return []
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    try:
        items = list(paths)
    except TypeError:
        raise InputError(f"ingest takes a path or a list of paths, got {type(paths).__name__}") from None
    bad = [type(p).__name__ for p in items if not isinstance(p, (str, Path))]
    if bad:
        raise InputError(f"ingest takes a path or a list of paths, got an item of type {bad[0]}")
    return [Path(p) for p in items]


def _source(n: int, hit: Hit) -> Source:
    return Source(n=n, paper_id=hit.paper.paper_id, title=hit.paper.display_title, authors=hit.paper.authors,
                  url=hit.paper.url, score=hit.score, passage=hit.chunk.text, cited=False)

