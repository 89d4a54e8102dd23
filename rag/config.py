"""One typed settings object. Precedence: explicit override (CLI flag) > `RAG_*` variable > `.env` >
default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_DIR = PACKAGE_DIR.parent
APP_NAME = "rag-papers"


def running_from_checkout() -> bool:
    """Whether this code runs from a source checkout (an editable install, or the repository on the
    path) rather than from an installed wheel, whose parent directory is site-packages."""
    return (PROJECT_DIR / "pyproject.toml").is_file() and (PROJECT_DIR / "corpus").is_dir()


def _default_store_dir() -> Path:
    # A checkout keeps its index beside the code (store/, git-ignored); an installed package must
    # not write into site-packages, so it keeps it in the per-user data directory
    # (~/.local/share/rag-papers/store).
    if running_from_checkout():
        return PROJECT_DIR / "store"
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "store"


def _bundled_corpus_dir() -> Path:
    # The seed abstracts: the checkout's corpus/, or the copy the wheel ships as package data
    # (rag/seeds/, mapped from corpus/ in pyproject.toml).
    return PROJECT_DIR / "corpus" if running_from_checkout() else PACKAGE_DIR / "seeds"


DEFAULT_STORE_DIR = _default_store_dir()


def user_env_file() -> Path:
    """The per-user settings file, read after the environment and a `.env` in the current directory:
    ~/.config/rag-papers/.env on Linux (XDG_CONFIG_HOME is honoured)."""
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / ".env"


def env_files() -> list[Path]:
    """The `.env` files settings are read from, the one that wins first: the current directory's (a
    project's own settings), then the per-user one (settings for every directory)."""
    return [Path(".env").absolute(), user_env_file()]


MINILM_EMBED_MODEL = "all-MiniLM-L6-v2"
# all-MiniLM-L6-v2 trained here on questions about ML papers (bench/retrieval/adapt_embedder.py),
# shipped in this package as int8 ONNX: the default (docs/retrieval.md).
ML_EMBED_MODEL = "minilm-l6-ml-v1"
DEFAULT_EMBED_MODEL = ML_EMBED_MODEL
MPNET_EMBED_MODEL = "all-mpnet-base-v2"
# all-MiniLM-L6-v2 reads at most 256 word pieces including [CLS] and [SEP].
MINILM_MAX_TOKENS = 256
# hybrid fuses dense and BM25 the way measured best for the embedding model; hybrid-rrf and
# hybrid-convex force reciprocal rank fusion or a convex combination of scores.
RETRIEVAL_MODES = ("bm25", "dense", "hybrid", "hybrid-rrf", "hybrid-convex")
MAX_QUESTION_CHARS = 2000
MAX_K = 100  # papers a question may retrieve


def keyword_stemmer_for(setting: str, embed_model: str) -> str:
    """The keyword stemmer a new store gets: the setting, or for `auto` what measured best with its
    embedding model (docs/retrieval.md: Snowball with all-mpnet-base-v2's convex fusion)."""
    if setting != "auto":
        return setting
    return "snowball" if embed_model == MPNET_EMBED_MODEL else "light"


def dense_weight_for(settings: Settings) -> float:
    """Convex fusion's dense weight: the setting, or what measured best with the embedding model."""
    if settings.dense_weight is not None:
        return settings.dense_weight
    return 0.5 if settings.embed_model == MPNET_EMBED_MODEL else 0.65


def check_k(k: object) -> int:
    """The one check of k (papers per question), for settings, the API, the CLI and `rag eval`."""
    from rag.errors import InputError

    if isinstance(k, bool) or not isinstance(k, int):
        raise InputError(f"k must be a whole number, got {k!r}")
    if not 1 <= k <= MAX_K:
        raise InputError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def check_mode(mode: object) -> str:
    """The one check of a retrieval mode name."""
    from rag.errors import InputError

    if mode not in RETRIEVAL_MODES:
        raise InputError(
            f"unknown retrieval mode {mode!r}; use one of: {', '.join(RETRIEVAL_MODES)}"
        )
    return str(mode)


_SECRET_PARAM = re.compile(r"key|token|secret|passw|auth|sig|credential", re.I)


def redact_url(url: str | None) -> str:
    """A URL as it may be shown or logged: user:password@ and secret-looking query values hidden."""
    if not url:
        return ""
    try:
        # Without "//" urlsplit reads "user:pass@host" as scheme "user" and path "pass@host": read
        # it as the host part it is, so that the password is hidden there too.
        schemeless = "//" not in url
        parts = urlsplit("//" + url if schemeless else url)
        host = parts.netloc.rpartition("@")[2]
        netloc = f"***@{host}" if "@" in parts.netloc else parts.netloc
        query = "&".join(
            f"{k}=***" if _SECRET_PARAM.search(k) else (f"{k}={v}" if v else k)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        )
        shown = urlunsplit(
            (parts.scheme, netloc, parts.path, query, "***" if parts.fragment else "")
        )
        return shown.removeprefix("//") if schemeless else shown
    except ValueError:  # not a URL at all: show none of it
        return "<unparsable URL>"


class Settings(BaseSettings):
    """Every knob of the project. Each field maps to the `RAG_<FIELD>` environment variable."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        # The .env files are found when settings are made, not when this module is imported, so a
        # changed working directory or XDG_CONFIG_HOME counts. Of pydantic's files, a later one
        # wins: reversed.
        from pydantic_settings import DotEnvSettingsSource

        dotenv = DotEnvSettingsSource(settings_cls, env_file=list(reversed(env_files())))
        return init_settings, env_settings, dotenv, file_secret_settings

    store_dir: Path = Field(
        default_factory=lambda: DEFAULT_STORE_DIR,
        validate_default=True,
        description=(
            "Where the index lives (SQLite manifest, keyword index, embedded Chroma). Default: the "
            "checkout's store/ when running from one, else the per-user data directory "
            "(~/.local/share/rag-papers/store on Linux)."
        ),
    )
    corpus_dir: Path = Field(
        default_factory=_bundled_corpus_dir,
        validate_default=True,
        description="The bundled seed corpus, ingested into the default store while it is empty.",
    )
    chroma_url: str | None = Field(
        default=None,
        description=(
            "A Chroma server (http://host:port); vectors live there instead of the store directory."
        ),
    )
    chroma_text: bool = Field(
        default=True,
        description=(
            "Write each chunk's text into embedded Chroma beside its vector, for apps that read the"
            " collection directly (LlamaIndex's ChromaVectorStore: nodes with text). Chroma indexes"
            " it for full-text search, so the collection is about 3x larger (the 76 seed papers:"
            " 1.9 MB against 0.6 MB); false for a large corpus no other app reads. Answers do not"
            " use it. A Chroma server always holds the text."
        ),
    )
    collection: str | None = Field(
        default=None,
        min_length=3,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]$",
        description=(
            "Chroma collection name (3-512 letters, digits, '.', '_', '-'). Default: 'papers' in"
            " embedded Chroma (one per store directory); with RAG_CHROMA_URL, the name the store"
            " recorded at its first ingest, else one derived from the store directory and host"
            " (papers-<dir>-<8 hex>), so two stores never share a collection by accident. Give"
            " every replica that serves one corpus the same name."
        ),
    )
    embed_model: str = Field(
        default=DEFAULT_EMBED_MODEL,
        description=(
            "Embedding model: 'minilm-l6-ml-v1' (all-MiniLM-L6-v2 trained on questions about ML"
            " papers: bundled, ONNX, no torch), 'all-MiniLM-L6-v2' (the model it was trained from;"
            " bundled), 'all-mpnet-base-v2'"
            " (better on paraphrased questions, ~5x slower to ingest; [mpnet] extra),"
            " 'nomic-embed-text-v1.5' (stronger still on names and paraphrases, ~4 abstracts/s: for"
            " small corpora; torch and bash scripts/install_nomic.sh), 'openai:<model>' (OpenAI or"
            " OPENAI_BASE_URL-compatible endpoint), 'st:<name-or-path>' (sentence-transformers,"
            " optional extra)."
        ),
    )
    model_cache_dir: Path = Field(
        default=Path("~/.cache/rag/models"),
        validate_default=True,
        description=(
            "Where models shipped split over packages are joined once: all-mpnet-base-v2 (~440 MB),"
            " the local LLM (1.1 GB)."
        ),
    )
    answer_vector_cache: bool = Field(
        default=True,
        description=(
            "Keep the vectors answers compute for the papers' sentences on disk (at most ~80 MB in"
            " model_cache_dir/answer-vectors), so that a new process (each `rag ask`) does not"
            " embed the same papers again."
        ),
    )
    embed_base_url: str | None = Field(
        default=None,
        description=(
            "Base URL of an OpenAI-compatible embeddings endpoint (default: OPENAI_BASE_URL)."
        ),
    )
    embed_backend: Literal["auto", "onnx", "torch"] = Field(
        default="auto",
        description=(
            "How all-MiniLM-L6-v2 runs at ingest: onnx (int8, bundled), torch (bfloat16 where the"
            " CPU has it; needs the [fast] extra), auto (torch for ingests of 300+ abstracts when"
            " installed and the CPU has bfloat16). Questions always use onnx, and so does"
            " minilm-l6-ml-v1, the default."
        ),
    )
    chunk_size: int = Field(
        default=240,
        ge=48,
        le=250,
        description=(
            "Chunk size in tiktoken tokens (must stay under the embedder's 256 word pieces)."
        ),
    )
    chunk_overlap: int = Field(
        default=30, ge=0, description="Token overlap between chunks of one abstract."
    )
    top_k: int = Field(default=5, description=f"Papers retrieved per question (1 to {MAX_K}).")
    mode: str = Field(
        default="hybrid",
        description=(
            "Retrieval mode: bm25, dense, or both fused: hybrid (reciprocal rank fusion with"
            " all-MiniLM-L6-v2, convex with all-mpnet-base-v2: what measured best for each),"
            " hybrid-rrf, hybrid-convex."
        ),
    )
    rrf_k: int = Field(default=60, ge=1, description="Reciprocal rank fusion constant.")
    dense_weight: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "Weight of the dense similarity in convex fusion (hybrid-convex, and hybrid with"
            " all-mpnet-base-v2); BM25 gets the rest. Unset: 0.5 for all-mpnet-base-v2, 0.65 for"
            " other models (what measured best for each)."
        ),
    )
    keyword_stemmer: Literal["auto", "light", "snowball"] = Field(
        default="auto",
        description=(
            "How the keyword index folds words, recorded with a store when it is created: light"
            " (plurals only), snowball (Snowball English stems), auto (snowball for"
            " all-mpnet-base-v2, where it measured better, light otherwise). Set on `rag ingest`"
            " into an existing store, its keyword index is rebuilt that way (no re-embedding)."
        ),
    )
    name_boost: float = Field(
        default=2.0,
        ge=1.0,
        description=(
            "When the question names a term rare in the corpus (a method name), the keyword matches"
            " holding it are fused once more with weight name_boost - 1."
        ),
    )
    candidates: int = Field(
        default=50, ge=1, description="Chunks fetched per retriever before fusion."
    )
    abstain_threshold: float = Field(
        default=0.3,
        description=(
            "Below this best dense cosine similarity the answer says the papers do not answer."
        ),
    )
    unknown_name_threshold: float = Field(
        default=0.5,
        description=(
            "A question naming something no indexed paper or author mentions is answered only when"
            " a paper is at least this similar (dense cosine); below it the answer says the papers"
            " do not answer."
        ),
    )
    llm: Literal["openai", "local", "none"] | None = Field(
        default=None,
        description=(
            "LLM backend; unset: OpenAI-compatible when OPENAI_BASE_URL or OPENAI_API_KEY is set,"
            " else none."
        ),
    )
    llm_model: str = Field(
        default="gpt-4o-mini", description="Model name at the OpenAI-compatible endpoint."
    )
    local_model_path: Path | None = Field(
        default=None,
        description=(
            "GGUF file for RAG_LLM=local (default: Qwen2.5-Coder-1.5B-Instruct from the [local]"
            " extra, assembled once into RAG_MODEL_CACHE_DIR)."
        ),
    )
    llm_threads: int = Field(
        default=0, ge=0, description="CPU threads for RAG_LLM=local (0: every core)."
    )
    llm_writing_threads: int = Field(
        default=0,
        ge=0,
        description=(
            "RAG_LLM=local: threads that write the answer, at most RAG_LLM_THREADS (0: the cores"
            " other processes left free while the model read its prompt, so a busy machine writes"
            " with fewer threads, faster)."
        ),
    )
    llm_prompt_cache: bool = Field(
        default=True,
        description=(
            "RAG_LLM=local: keep the model's reading of the prompt's fixed instructions on disk"
            " (~10 MB in model_cache_dir/prompt-states), so that a new process (each `rag ask`)"
            " starts answering seconds sooner."
        ),
    )
    llm_temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Sampling temperature of answers."
    )
    llm_context_tokens: int = Field(
        default=3000, ge=256, description="Token budget for the sources in the prompt."
    )
    llm_source_tokens: int = Field(
        default=60,
        ge=0,
        description=(
            "Most tokens of each source passage in the prompt, the best source's aside in evidence"
            " answers (at least the sentence closest to the question is kept; free answers also"
            " keep the first); 0: whole passages."
        ),
    )
    answer_style: Literal["evidence", "free"] = Field(
        default="evidence",
        description=(
            "How the LLM answers: evidence (it names the numbered source sentences that state the"
            " answer and writes a one- or two-sentence synthesis; the sentences are quoted exactly,"
            " 'which papers' questions become a list, and a question the papers discuss but do not"
            " answer gets 'not stated') or free (one to four sentences in its own words, each"
            " citing a source)."
        ),
    )
    llm_top_source_tokens: int = Field(
        default=400,
        ge=0,
        description=(
            "Evidence answers: most tokens of the best source in the prompt (its whole abstract, "
            "usually); the other sources get RAG_LLM_SOURCE_TOKENS each."
        ),
    )
    not_stated_threshold: float = Field(
        default=0.45,
        description=(
            "Evidence answers: when the model names no sentence that answers, the answer says the"
            " papers discuss the question but do not state it if the best dense cosine similarity"
            " is at least this (or the question names a term a retrieved paper holds); below it,"
            " that the papers do not cover it. The same for every answer a rule holds back,"
            " extractive ones too (docs/answers.md)."
        ),
    )
    rules_off: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Answer rules turned off, by name, comma-separated (RAG_RULES_OFF=grafted_words,"
            "boilerplate): any row of the table of rules in docs/answers.md. For measuring what a"
            " rule contributes (`rag eval --without RULE` sets it); a rule's own setting below"
            " (RAG_TOPIC_CHECK, ...) turns it off too."
        ),
    )
    answer_type_check: bool = Field(
        default=True,
        description=(
            "Evidence answers: a question asking for a number (how many, what accuracy) or for"
            " names (which benchmarks, what base model) whose answer holds none that the question"
            " did not already hold is answered 'not stated', with the closest sentences quoted;"
            " so is one whose number or names come only from another paper than the one asked"
            " about, and (extractive answers too) one naming something none of the cited papers"
            " writes. The rules answer_type, answer_source and answer_names of docs/answers.md."
        ),
    )
    topic_check: bool = Field(
        default=True,
        description=(
            "Evidence and extractive answers: a question whose topic term or name (a term such as"
            " 'spiking' or 'knowledge graph' from a list built from older abstracts; a name such as"
            " 'GPT-3') none of the retrieved papers holds is not put to the model; the answer says"
            " which term none mentions, then quotes the closest sentences when the papers are on"
            " the subject, else refuses."
        ),
    )
    background_check: bool = Field(
        default=True,
        description=(
            "A question that papers outside the index (a shipped library of ~13k NeurIPS 2023-2025"
            " abstracts' vectors) match far more closely than any indexed paper is refused as not"
            " covered, before the model reads anything (stores of the default embedding model only;"
            " rag/answer/rules/background.py)."
        ),
    )
    background_margin: float = Field(
        default=0.15,
        ge=0.0,
        le=2.0,
        description=(
            "RAG_BACKGROUND_CHECK: how far (cosine) the best indexed paper may fall below the"
            " library's best before the question counts as not covered ('which papers' questions"
            " get 0.04 more)."
        ),
    )
    llm_check: bool = Field(
        default=False,
        description=(
            "Ask the model whether the sources answer the question (one token, on its cached"
            " prompt): free answers ask before answering, evidence answers ask after, about the"
            " sentences it named; below RAG_LLM_CHECK_THRESHOLD the answer is 'not stated'"
            " (evidence) or a refusal (free). Off by default: its probability did not tell"
            " answerable questions from near misses (docs/lab/answers-history.md)."
        ),
    )
    llm_check_threshold: float = Field(
        default=0.8,
        ge=0.0,
        le=1.0,
        description=(
            "Least probability of 'yes' (of yes or no) from the answerability check for an answer."
        ),
    )
    llm_rewrite: bool = Field(
        default=False,
        description=(
            "Rewrite follow-ups into standalone questions with the LLM instead of the rule (prepend"
            " the conversation's topic to a short follow-up). Off by default: the rule finds the"
            " right paper more often (docs/answers-free.md)."
        ),
    )
    llm_require_support: bool = Field(
        default=True,
        description=(
            "Withdraw an answer none of whose citations the support check finds in the cited"
            " passage, and say the indexed papers don't answer the question instead."
        ),
    )
    llm_max_tokens: int = Field(default=512, ge=16, description="Most tokens the LLM may generate.")
    llm_timeout: float = Field(
        default=60.0, gt=0, description="Seconds before an LLM request times out."
    )
    llm_retries: int = Field(default=2, ge=0, description="Retries for transient LLM failures.")
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAG_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
        description=(
            "OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp server...). Env: OPENAI_BASE_URL."
        ),
    )
    openai_api_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAG_OPENAI_API_KEY", "OPENAI_API_KEY"),
        description="API key for OpenAI (not needed for most local servers). Env: OPENAI_API_KEY.",
        repr=False,
    )
    ui_host: str = Field(
        default="127.0.0.1",
        validation_alias=AliasChoices("RAG_UI_HOST", "GRADIO_SERVER_NAME"),
        description="Address the UI binds (GRADIO_SERVER_NAME also honoured).",
    )
    ui_auth: str | None = Field(
        default=None,
        repr=False,
        description="Optional login for the UI, as user:password (RAG_UI_AUTH).",
    )
    ui_port: int = Field(
        default=7860,
        ge=1,
        le=65535,
        validation_alias=AliasChoices("RAG_UI_PORT", "GRADIO_SERVER_PORT"),
        description="Port of the UI (GRADIO_SERVER_PORT also honoured).",
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description=(
            "Key `rag serve` requires on every route but /healthz, as `Authorization: Bearer <key>`"
            " (RAG_API_KEY). Unset: no key; then `rag serve` binds only loopback unless"
            " --allow-no-key."
        ),
    )
    api_port: int = Field(
        default=8000, ge=1, le=65535, description="Port of `rag serve` (RAG_API_PORT)."
    )

    @field_validator("store_dir", "corpus_dir", "model_cache_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("rules_off", mode="before")
    @classmethod
    def _names(cls, value):
        # The names are checked against the table of rules where it is read (rag.answer.rules).
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value

    @field_validator("top_k", mode="after")
    @classmethod
    def _k(cls, value: int) -> int:
        return _as_value_error(check_k, value)

    @field_validator("mode", mode="after")
    @classmethod
    def _mode(cls, value: str) -> str:
        return _as_value_error(check_mode, value)

    @field_validator(
        "chroma_url",
        "openai_base_url",
        "openai_api_key",
        "embed_base_url",
        "api_key",
        mode="before",
    )
    @classmethod
    def _blank_is_none(cls, value):
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("openai_base_url", "embed_base_url", mode="after")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        # The OpenAI client needs the scheme; without it the error would echo the URL, password and
        # all.
        if value is not None and not value.strip().lower().startswith(("http://", "https://")):
            raise ValueError(
                f"the endpoint URL needs http:// or https:// in front (got {redact_url(value)}), "
                "e.g. http://localhost:8080/v1"
            )
        return value

    @property
    def is_default_store(self) -> bool:
        """Whether the store is the default one (see `store_dir`): the one that builds itself from
        the seeds."""
        return self.store_dir == DEFAULT_STORE_DIR.resolve()

    @property
    def llm_backend(self) -> str:
        """The LLM actually used: 'openai', 'local' or 'none'."""
        if self.llm is not None:
            return self.llm
        if self.openai_base_url or self.openai_api_key:
            return "openai"
        return "none"


def _as_value_error(check, value):
    # pydantic reports ValueErrors as validation errors (RAG(...) turns them into one InputError
    # line).
    from rag.errors import InputError

    try:
        return check(value)
    except InputError as exc:
        raise ValueError(str(exc)) from None
