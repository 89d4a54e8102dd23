"""The engine: `RAG` ties store, retrieval and answering together; CLI, UI and apps sit on it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rag.answer import respond as answering
from rag.answer.generation import DEFAULT_READING_RATE, ReadingClock
from rag.answer.question import clean_question, rewrite
from rag.backends.embedders import known_model
from rag.config import Settings, check_k, check_mode, redact_url
from rag.errors import InputError
from rag.index.store import CORPUS_PENDING, SCHEMA_VERSION, Store, no_papers_on_server
from rag.models import Answer, AnswerStream, RetrievalScores, Source
from rag.retrieve.normalise import normalise
from rag.retrieve.search import Hit, rescored, search

if TYPE_CHECKING:
    from rag.answer.sentence_vectors import SentenceVectors
    from rag.backends.chat import ChatModel
    from rag.backends.embedders import Embedder
    from rag.index.corpus import Paper
    from rag.index.replica import CatchUp
    from rag.llamaindex import LLM, BaseEmbedding
    from rag.models import IngestReport
    from rag.paper_map.layout import PaperMap


class RAG:
    """Paper Q&A over one index. Safe to share between threads.

    `RAG(settings=None, *, embedder=None, llm=None, **overrides)`: overrides are `Settings` fields
    (e.g. `store_dir=...`, `top_k=8`). `embedder` and `llm` take models an app already has instead
    of the ones the settings name: an `Embedder` or a LlamaIndex `BaseEmbedding`; a `ChatModel` or a
    LlamaIndex `LLM` (`llm` also takes the setting's own values, "openai", "local" or "none").
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        embedder: Embedder | BaseEmbedding | None = None,
        llm: str | ChatModel | LLM | None = None,
        **overrides,
    ) -> None:
        chat_model = None
        if llm is not None and not isinstance(llm, str):
            from rag.llamaindex import as_chat_model

            chat_model = as_chat_model(llm)
        elif llm is not None:
            overrides["llm"] = llm
        unknown = [name for name in overrides if name not in Settings.model_fields]
        # Settings ignores unknown names (.env may hold others): a typo here must not pass unseen.
        if unknown:
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
            # An index is queried with the model that built it unless RAG_EMBED_MODEL says
            # otherwise.
            built_with = self.store.recorded_embedding_model()
            if built_with and built_with != settings.embed_model and known_model(built_with):
                settings = settings.model_copy(update={"embed_model": built_with})
                self.store.settings = settings
        self.settings = settings
        self._embedder: Embedder | None = None
        if embedder is not None:
            from rag.llamaindex import as_embedder

            self._embedder = as_embedder(embedder)
        self._sentence_vectors: SentenceVectors | None = None
        self._query_vectors: SentenceVectors | None = None
        self._llm: ChatModel | None = chat_model
        self._llm_ready = chat_model is not None
        self._lock = threading.RLock()
        # the last catch-up with a Chroma server that changed the caches (rag/index/replica.py)
        self.caught_up: CatchUp | None = None
        self._map_lock = threading.Lock()  # one layout at a time (a UI's sessions share the engine)
        # How fast this engine's model reads a prompt, for the wait shown while it does.
        self._reading_clock = (
            ReadingClock(
                DEFAULT_READING_RATE,
                settings.model_cache_dir / "reading-rate.json",
                f"{settings.local_model_path or 'qwen2.5-coder-1.5b-q4_k_m'}"
                f"|threads={settings.llm_threads or os.cpu_count()}",
            )
            if chat_model is None and settings.llm_backend == "local"
            else ReadingClock()
        )

    # ---- parts -------------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The embedding model: the one passed in, else the one `embed_model` names."""
        if self._embedder is None:
            from rag.backends.embedders import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    def remember_vectors(self, capacity: int | None = None, query_capacity: int | None = None):
        """Start the memos of the vectors questions use (rag/answer/sentence_vectors.py), with
        room for this many texts and questions (default: theirs)."""
        from rag.answer.disk_vectors import disk_vectors
        from rag.answer.sentence_vectors import CAPACITY, QUERY_CAPACITY, SentenceVectors
        from rag.backends.embedders import sentence_scorer

        room = (
            CAPACITY if capacity is None else capacity,
            QUERY_CAPACITY if query_capacity is None else query_capacity,
        )
        scorer = sentence_scorer(self.embedder)
        disk = (
            disk_vectors(scorer, self.settings.model_cache_dir)
            if self.settings.answer_vector_cache
            else None
        )
        self._sentence_vectors = SentenceVectors(scorer, *room, disk=disk)
        same = scorer is self.embedder
        self._query_vectors = (
            self._sentence_vectors if same else SentenceVectors(self.embedder, *room)
        )

    @property
    def _answer_embedder(self) -> SentenceVectors:
        """The embedder answers score sentences with (`sentence_scorer`: the index's model, or the
        one the answer rules were measured with), remembering recent vectors."""
        if self._sentence_vectors is None:
            self.remember_vectors()
        assert self._sentence_vectors is not None
        return self._sentence_vectors

    @property
    def _query_embedder(self) -> SentenceVectors:
        """The embedder retrieval embeds questions with (the index's model), remembering them."""
        if self._query_vectors is None:
            self.remember_vectors()
        assert self._query_vectors is not None
        return self._query_vectors

    @property
    def has_llm(self) -> bool:
        """Whether answers are generated: a chat model was passed in, or the settings name a
        backend."""
        return self._llm is not None if self._llm_ready else self.settings.llm_backend != "none"

    @property
    def llm(self) -> ChatModel | None:
        """The chat backend (passed in, OpenAI-compatible or local), or None when answers are
        extractive."""
        with self._lock:
            if not self._llm_ready:
                from rag.backends.chat import make_llm

                self._llm = make_llm(self.settings)
                self._llm_ready = True
        return self._llm

    @property
    def retriever(self):
        """A LlamaIndex `BaseRetriever` (hybrid, one node per paper)."""
        from rag.llamaindex import make_llamaindex_retriever

        return make_llamaindex_retriever(self)

    @property
    def query_engine(self):
        """A LlamaIndex `BaseQueryEngine`: `as_query_engine()`."""
        return self.as_query_engine()

    def as_query_engine(
        self,
        streaming: bool = False,
        node_postprocessors: list | None = None,
        similarity_top_k: int | None = None,
    ):
        """A LlamaIndex `BaseQueryEngine` (named as LlamaIndex names it): retrieves
        `similarity_top_k` papers (default `top_k`), runs the `node_postprocessors` on them and
        answers from the nodes they leave; the response's `source_nodes` are the sources in `[n]`
        order and `metadata['answer']` the `Answer`. `streaming`: a `StreamingResponse`."""
        from rag.llamaindex import make_query_engine

        return make_query_engine(self, streaming, node_postprocessors, similarity_top_k)

    def as_chat_engine(self):
        """A LlamaIndex `BaseChatEngine` answering as `chat` does (follow-ups rewritten)."""
        from rag.llamaindex import make_chat_engine

        return make_chat_engine(self)

    @property
    def embed_model(self):
        """The store's embedder as a LlamaIndex `BaseEmbedding` (for a LlamaIndex app that opens
        this product's Chroma collection)."""
        from rag.llamaindex import make_embed_model

        return make_embed_model(self)

    # ---- index -------------------------------------------------------------------------------

    def ingest(
        self,
        paths: str | Path | list[str | Path] | None = None,
        rebuild: bool = False,
        include_corpus: bool | None = None,
        progress: bool = False,
        shared: bool = False,
        cap_malloc_arenas: bool = False,
    ) -> IngestReport:
        """Add corpus files to the index. The bundled `corpus/` goes in with no paths, into the
        default store while it is empty, or when `include_corpus` is True; never when it is False (a
        store of your own holds what you ingest). `rebuild` empties the store first; on a Chroma
        server it refuses (`InputError`) to delete a collection other stores write into unless
        `shared` is True. Returns an `IngestReport`. `cap_malloc_arenas`: first cap glibc's malloc
        arenas for the whole process, as `rag ingest` does (less peak memory: rag/index/ingest.py);
        else the allocator is the app's to tune."""
        from rag.backends.embedders import MINILM_MAX_TOKENS, ingest_embedder
        from rag.index.ingest import bound_malloc_arenas, index_records, plan_ingest

        if cap_malloc_arenas:
            bound_malloc_arenas()  # before the ingest's threads start
        files = _as_paths(paths)
        if not rebuild:
            self.catch_up()  # on a server: papers other stores added are not embedded again
        with self._lock, self.store.writer():
            self.store.check_home()  # a copied store directory must not write into another's
            empty = rebuild or self.store.last_rowid() < 0
            # A first ingest killed before all of corpus/ was in leaves a store that is not empty
            # but still owes it: the flag makes the next ingest finish corpus/ too.
            owed = (
                not rebuild and self.store.exists() and self.store.meta(CORPUS_PENDING) is not None
            )
            if include_corpus is None:
                with_corpus = owed or not files or (empty and self.settings.is_default_store)
            else:
                with_corpus = include_corpus
            if with_corpus:
                files = [self.settings.corpus_dir, *files]
            if not files:
                raise InputError("nothing to ingest; pass corpus files or drop --no-corpus")
            # Every file is read through before the store is touched.
            plan = plan_ingest(
                files,
                self.store.known_abstracts() if self.store.exists() and not rebuild else set(),
            )
            if rebuild:
                if not shared:
                    self.store.check_rebuild_alone()
                self.store.clear()
            else:
                self.store.check_compatible(self.embedder.model_id)
            wrote = bool(len(plan))
            embedder = (
                ingest_embedder(self.settings, self.embedder, len(plan)) if wrote else self.embedder
            )
            max_tokens = getattr(embedder, "max_tokens", None) or MINILM_MAX_TOKENS
            if with_corpus and wrote:
                self.store.set_meta(CORPUS_PENDING, "1")
            report = index_records(
                self.store,
                embedder,
                plan,
                self.settings.chunk_size,
                self.settings.chunk_overlap,
                max_tokens,
                progress,
            )
            if with_corpus and (wrote or owed):
                self.store.set_meta(CORPUS_PENDING, None)
            self.store.register_replica(self.embedder.model_id)
            return report

    @property
    def needs_build(self) -> bool:
        """Whether the first question will build the default store from `corpus/` (a one-time
        wait)."""
        return self.settings.is_default_store and self.store.last_rowid() < 0

    def ensure_index(self, progress: bool = True) -> None:
        """Build the default store from `corpus/` the first time a question meets it empty; any
        other store must exist (see `Store.check_readable`). On a Chroma server the store's caches
        are first brought level with the collection (rag/index/replica.py): one request when they
        are."""
        self.catch_up()
        self.store.check_readable()
        # last_rowid is one index lookup; counting papers scans the table (~10 ms at 100k papers).
        if self.store.last_rowid() < 0 and self.settings.is_default_store:
            with self._lock:
                if self.store.last_rowid() < 0:
                    self.ingest(progress=progress)
        self.store.check_compatible(self.embedder.model_id)

    def paper_map(self, progress: Callable[[str], None] | None = None) -> PaperMap:
        """The 2-D map of the indexed papers (laid out on first use and cached in the store; papers
        ingested later are placed on it incrementally). `progress` gets a line before slow work."""
        from rag.extras import require
        from rag.paper_map.layout import paper_map

        require("map")
        self.ensure_index(progress=progress is not None)
        with self._map_lock:
            return paper_map(self.store, progress)

    def map_page(
        self,
        pmap: PaperMap | None = None,
        answer: Answer | None = None,
        abstracts: bool | None = None,
    ) -> str:
        """The map as one self-contained HTML page (`rag map`, the chat's /map). `pmap`: from
        `paper_map()` (laid out here when None); `answer`: its cited and retrieved papers lit up;
        `abstracts`: put them in the page (default: for maps of up to 20,000 papers)."""
        from rag.paper_map.layout import map_data
        from rag.paper_map.page import render_map_html

        pmap = self.paper_map() if pmap is None else pmap
        return render_map_html(map_data(self.store, pmap, answer, abstracts=abstracts))

    @staticmethod
    def map_highlight(sources: list[Source]) -> dict:
        """An answer's papers as the map page lights them: {"cited": [ids], "retrieved": [ids]}."""
        from rag.paper_map.layout import highlight_of

        return highlight_of(sources)

    def catch_up(self) -> None:
        """With a Chroma server (`RAG_CHROMA_URL`): bring this store's caches (manifest, keyword
        index, map) level with the corpus in its collection there, fetching only what they lack;
        done before every question, so an app need not call it. What changed is in `caught_up`.
        Nothing to do without a server."""
        if self.settings.chroma_url:
            from rag.index.replica import catch_up

            # The model a new replica records: the app's own embedder's, else the configured one
            # (the server's metadata names one too, believed only for a built-in model).
            model = self._embedder.model_id if self._embedder is not None else None
            done = catch_up(self.store, model or self.settings.embed_model)
            if done is not None:
                self.caught_up = done

    def stats(self) -> dict:
        """What `rag stats` shows: papers, chunks, model, schema, the store, the Chroma path or URL
        and the collection."""
        url = self.settings.chroma_url
        self.catch_up()
        self.store.check_readable()
        return {
            "papers": self.store.paper_count(),
            "chunks": self.store.chunk_count(),
            "embedding_model": self.store.meta("embedding_model") if self.store.exists() else None,
            "schema_version": int(self.store.meta("schema_version") or SCHEMA_VERSION)
            if self.store.exists()
            else SCHEMA_VERSION,
            "store": self.store.location,
            # Where the vectors are, for a LlamaIndex or Chroma app opening the collection itself.
            "chroma_path": None if url else str(self.store.dir / "chroma"),
            "chroma_url": redact_url(url) if url else None,
            "collection": self.store.collection_name,
        }

    def readiness(self) -> tuple[int, str | None]:
        """(papers indexed, why the index cannot answer yet or None): a server's health check. With
        a Chroma server the caches are first brought level with it (no paper there: not ready)."""
        self.catch_up()
        papers = self.store.paper_count()
        return papers, None if papers else no_papers_on_server(self.store.collection_name)

    def repair(self, progress: bool = False) -> str:
        """Re-index a damaged store from what its papers.sqlite still holds, keeping the old files
        aside (`rag repair`; rag/index/repair.py). Returns what it did, as lines of text: papers
        kept, papers lost and where their ids are listed, where the old files went."""
        from rag.index.repair import repair

        return repair(self, progress=progress).summary()

    # ---- retrieval ---------------------------------------------------------------------------

    @staticmethod
    def check_question(question: object) -> str:
        """A question as `ask` and `stream` take it (trimmed); InputError when it is empty, too
        long or not text. For a surface that names the bad argument before an answer starts."""
        return clean_question(question)

    def order_legend(self, mode: str | None = None) -> str:
        """A sentence saying what orders `search`'s results in `mode` (default: the configured
        one)."""
        from rag.retrieve.search import order_legend

        mode = check_mode(self.settings.mode if mode is None else mode)
        return order_legend(mode, self.settings.embed_model)

    def _retrieve(
        self, query: str, k: int | None = None, mode: str | None = None, scored: bool = True
    ) -> list[Hit]:
        """The hits behind `search` and answers (private: `Hit` is an internal type): `scored`, as
        an answer reads them (`_scored`), else with the index's own cosines."""
        query = clean_question(query)
        k, mode = self._k_and_mode(k, mode)
        self.ensure_index()
        query = normalise(query, self.store)
        hits = self._search(query, k, mode)
        return self._scored(hits, query) if scored else hits

    def _k_and_mode(self, k: int | None, mode: str | None) -> tuple[int, str]:
        """`k` and `mode` checked (InputError naming the fix), the settings' when None."""
        return (
            check_k(self.settings.top_k if k is None else k),
            check_mode(self.settings.mode if mode is None else mode),
        )

    def _search(self, query: str, k: int, mode: str) -> list[Hit]:
        """`_retrieve` for a query already cleaned and read as written, its index ensured."""
        if mode != "bm25":
            self.store.warm_vectors()
        return search(self.store, self._query_embedder, query, k, mode, self.settings)

    def _scored(self, hits: list[Hit], query: str) -> list[Hit]:
        """`hits` as an answer reads them: their cosines `sentence_scorer`'s, the model the answer
        rules' levels were measured with, when the index's model is another (`rescored`: it embeds
        the hits' chunks, ~0.4 s on two cores; `search` shows the index's own and stays fast)."""
        if self._query_embedder is self._answer_embedder:
            return hits
        return rescored(hits, self._answer_embedder, query, self.store)

    def search(self, query: str, k: int | None = None, mode: str | None = None) -> list[Source]:
        """Top-k papers for the query, each once with its best passage, scored by the index's
        model."""
        hits = self._retrieve(query, k, mode, scored=False)
        return [_source(i, h) for i, h in enumerate(hits, 1)]

    def guarded(
        self, sources: Sequence[Source | dict], raw: bool = False
    ) -> tuple[list[dict], list[list[dict]]]:
        """`sources` as JSON for an agent's model (`rag.guarded_source`) and, for each, its
        passage's sentences with their flags (`rag.guarded_sentences`): whether it reads as written
        to a reader or a model (the rules, and the probe when the embedder is its model); flagged
        text replaced unless `raw`."""
        from rag.answer.injection import guarded_sentences, guarded_source, probe_embed

        probe = probe_embed(self._answer_embedder)
        dumped = [s if isinstance(s, dict) else s.model_dump(mode="json") for s in sources]
        return (
            [guarded_source(s, raw, probe) for s in dumped],
            [guarded_sentences(str(s.get("passage") or ""), raw, probe) for s in dumped],
        )

    def papers(self, paper_ids: str | list[str]) -> list[Paper]:
        """The indexed papers with these ids (title, authors, url, venue, year), in the order given,
        each once. InputError naming the ids the index does not hold; `rag.cite.format_citations`
        cites them."""
        if paper_ids is None or not isinstance(paper_ids, (str, list, tuple, set, frozenset)):
            raise InputError(
                f"papers() takes a paper id or a list of them, e.g. 'wOAslbdI1r', got "
                f"{type(paper_ids).__name__}; `rag search QUERY` lists papers with their ids"
            )
        ids = [paper_ids] if isinstance(paper_ids, str) else list(paper_ids)
        if any(not isinstance(i, str) for i in ids):
            raise InputError("paper ids are text, e.g. 'wOAslbdI1r'")
        ids = list(dict.fromkeys(i.strip() for i in ids if i.strip()))
        if not ids:
            raise InputError("no paper id given; `rag search QUERY` lists papers with their ids")
        self.ensure_index()
        found: dict[str, Paper] = {}
        for start in range(0, len(ids), 500):  # SQLite caps the parameters of one query
            found.update(self.store.papers(ids[start : start + 500]))
        missing = [i for i in ids if i not in found]
        if missing:
            listed = ", ".join(repr(i) for i in missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise InputError(
                f"unknown paper id{'s' if len(missing) > 1 else ''} {listed}: not in the index at "
                f"{self.store.location}; `rag search QUERY` lists papers with their ids"
            )
        return [found[i] for i in ids]

    # ---- answers -----------------------------------------------------------------------------

    def ask(
        self,
        question: str,
        k: int | None = None,
        mode: str | None = None,
        llm: bool = True,
        history: list[dict] | None = None,
    ) -> Answer:
        """Answer with numbered citations (LLM when configured and `llm`, else extractive)."""
        return self.stream(question, k=k, mode=mode, llm=llm, history=history).answer

    def chat(self, message: str, history: list[dict] | None = None, **kwargs) -> Answer:
        """Answer a message in a conversation; follow-ups are rewritten into standalone
        questions."""
        return self.ask(message, history=history or [], **kwargs)

    def stream(
        self,
        question: str,
        k: int | None = None,
        mode: str | None = None,
        llm: bool = True,
        history: list[dict] | None = None,
    ) -> AnswerStream:
        """The answer as it is produced: iterating yields its text pieces (`str`), then `.answer` is
        the final `Answer` (`stream(q).answer` reads the rest first). With an LLM, an empty piece
        comes first, once the sources are found and the model starts reading them. Nothing runs
        until the stream is first read; errors (a bad question, a missing store) are raised from
        there."""
        return AnswerStream(self._answer(question, k, mode, llm, history))

    def _answer(
        self, question: str, k: int | None, mode: str | None, llm: bool, history: list[dict] | None
    ) -> Generator[str, None, Answer]:
        typed = clean_question(question)
        k, mode = self._k_and_mode(k, mode)
        self.ensure_index()  # once a question: on a Chroma server, a request
        # What retrieval and the rules read is the question as the papers write it ("what is
        # palimpsa" asks about Palimpsa); the answer keeps it as typed.
        question = normalise(typed, self.store)
        self._reading_clock.mark()  # how busy the machine is while the papers are found
        chat = self._chat_backend if llm and self.has_llm else None
        # The rule finds the topic of a follow-up better than a small model's rewrite (see
        # `llm_rewrite`).
        rewriter = chat if self.settings.llm_rewrite else None
        query = normalise(rewrite(question, history, rewriter), self.store) if history else question
        hits = self._search(query, k, mode)
        answer = yield from self._respond(question, query, hits, chat)
        return answer.model_copy(update={"question": typed})

    def _stream_from_hits(self, question: str, hits: list[Hit], llm: bool = True) -> AnswerStream:
        """`stream` for hits the caller chose: `_retrieve`'s, re-ranked or filtered by a LlamaIndex
        app's node postprocessors (rag/llamaindex.py); private, as `Hit` is an internal type."""

        def answer() -> Generator[str, None, Answer]:
            typed = clean_question(question)
            query = normalise(typed, self.store)  # as `_answer` reads it
            chat = self._chat_backend if llm and self.has_llm else None
            answered = yield from self._respond(query, query, hits, chat)
            return answered.model_copy(update={"question": typed})

        return AnswerStream(answer())

    def _respond(
        self, question: str, query: str, hits: list[Hit], chat: Callable[[], ChatModel] | None
    ) -> Generator[str, None, Answer]:
        """The answer from these hits (`query`: what they were retrieved with), read as answers read
        them (`_scored`)."""
        hits = self._scored(hits, query)
        sources = [_source(i, h) for i, h in enumerate(hits, 1)]
        return (
            yield from answering.respond(
                self.settings,
                self.store,
                self._answer_embedder,
                chat,
                question,
                query,
                hits,
                sources,
                self._reading_clock,
            )
        )

    def _chat_backend(self) -> ChatModel:
        """The chat backend, made on first use: the generated answers (rag/answer/free.py,
        evidence_answer.py) call this where a failure (LLMError) falls back to the extractive
        answer. Only called when `has_llm`."""
        backend = self.llm
        assert backend is not None
        return backend


def _as_paths(paths) -> list[Path]:
    """`ingest`'s paths: one path or a list of them (a bare string is one path, not its
    characters)."""
    if paths is None:
        return []
    if isinstance(paths, (str, Path)):
        return [Path(paths)]
    try:
        items = list(paths)
    except TypeError:
        raise InputError(
            f"ingest takes a path or a list of paths, got {type(paths).__name__}"
        ) from None
    bad = [type(p).__name__ for p in items if not isinstance(p, (str, Path))]
    if bad:
        raise InputError(f"ingest takes a path or a list of paths, got an item of type {bad[0]}")
    return [Path(p) for p in items]


def _source(n: int, hit: Hit) -> Source:
    """The hit at rank `n` as a `Source` (an answer renumbers its sources; `retrieval.rank`
    stays)."""
    return Source(
        n=n,
        paper_id=hit.paper.paper_id,
        title=hit.paper.display_title,
        authors=hit.paper.authors,
        url=hit.paper.url,
        score=hit.score,
        passage=hit.chunk.text,
        cited=False,
        retrieval=RetrievalScores(rank=n, fused=hit.fused, cosine=hit.cosine, keyword=hit.keyword),
    )
