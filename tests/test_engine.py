"""Answers from the engine (extractive path here; the LLM path is in test_llm.py) and the public
API."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import typing

import pytest

import rag
from rag import RAG, Answer
from rag.answer.citations import parse_markers, plain_text
from rag.errors import InputError
from rag.prompts import EXTRACTIVE_LABEL, REFUSAL


def test_public_api_is_pinned():
    assert rag.__all__ == sorted(rag.__all__)
    assert rag.__all__ == [
        "Answer",
        "AnswerStream",
        "Cancellation",
        "ChatModel",
        "Citation",
        "CollectionShared",
        "CorpusError",
        "Embedder",
        "GenerationCancelled",
        "IngestReport",
        "InputError",
        "LLMError",
        "PLACEHOLDER",
        "Paper",
        "PaperMap",
        "RAG",
        "RagError",
        "Reading",
        "RetrievalScores",
        "Settings",
        "Source",
        "StoreError",
        "UNTRUSTED_NOTE",
        "Usage",
        "Writing",
        "ask",
        "guarded_source",
        "read_in_thread",
        "search",
    ]
    assert rag.__version__ == importlib.metadata.version("rag-papers")


def _rag_types(annotation, found: set[type]) -> set[type]:
    """The classes of the `rag` package an annotation names, and those their fields name,
    recursively."""
    for arg in typing.get_args(annotation):
        _rag_types(arg, found)
    if (
        inspect.isclass(annotation)
        and annotation.__module__.startswith("rag.")
        and annotation not in found
    ):
        found.add(annotation)
        fields = getattr(annotation, "model_fields", None) or getattr(
            annotation, "__dataclass_fields__", {}
        )
        hints = typing.get_type_hints(annotation, globalns=_namespace()) if fields else {}
        for name in fields:
            _rag_types(hints.get(name), found)
    return found


def _namespace() -> dict:
    import rag.config
    import rag.index.corpus
    import rag.models
    import rag.paper_map.layout

    return {
        **vars(typing),
        **vars(rag.config),
        **vars(rag.index.corpus),
        **vars(rag.paper_map.layout),
        **vars(rag.models),
    }


def test_every_exported_name_exists_and_every_public_result_type_is_exported():
    """What `RAG`'s public methods, `rag.ask` and `rag.search` return (and the types inside it) can
    be imported from `rag` by name, so an app can annotate with them."""
    assert all(hasattr(rag, name) for name in rag.__all__)
    found: set[type] = set()
    public = [fn for name, fn in inspect.getmembers(RAG, callable) if not name.startswith("_")]
    for fn in [*public, rag.ask, rag.search]:
        _rag_types(typing.get_type_hints(fn, globalns=_namespace()).get("return"), found)
    assert {"Answer", "Source", "IngestReport", "PaperMap", "Paper"} <= {t.__name__ for t in found}
    assert sorted(t.__name__ for t in found if t.__name__ not in rag.__all__) == []


def test_python_dash_m_rag_is_the_cli():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rag", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith(rag.__version__)


def test_the_package_says_it_is_typed():
    from importlib.resources import files

    assert files("rag").joinpath("py.typed").is_file()


def test_extractive_answer_cites_its_sources(seed_rag):
    answer = seed_rag.ask("How does Palimpsa relate to Mamba2?")
    assert answer.mode == "extractive" and not answer.abstained
    assert answer.answer.startswith(EXTRACTIVE_LABEL)
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", answer.answer)}
    cited = {s.n for s in answer.sources if s.cited}
    assert markers == cited == {c.n for c in answer.citations}
    assert sorted(cited) == list(range(1, len(cited) + 1))  # cited first, in order of first use
    first = next(s for s in answer.sources if s.n == 1)
    assert first.paper_id == "wKMV7mXjUr"
    # Each quoted sentence is verbatim from the cited paper's abstract.
    by_n = {s.n: s for s in answer.sources}
    abstracts = {paper.paper_id: abstract for paper, abstract in seed_rag.store.all_papers()}
    for line in answer.answer.splitlines()[1:]:
        sentence, n = re.match(r"- (.*) \[(\d+)\]$", line).groups()
        assert plain_text(sentence) in abstracts[by_n[int(n)].paper_id]
    assert "Mamba2" in answer.answer


def test_off_topic_question_abstains_and_lists_nearest(seed_rag):
    answer = seed_rag.ask("What is a good recipe for chocolate cake?")
    assert answer.abstained and answer.answer.startswith(REFUSAL)
    assert answer.citations == [] and len(answer.sources) == 5
    assert not any(s.cited for s in answer.sources)


def test_question_about_something_no_paper_mentions_abstains(seed_rag):
    """The seeds have papers on efficient attention, but none mentions FlashAttention: a question
    about it is about a paper that is not indexed, even when another name in it is one a paper uses
    (BLEU). Names of authors, names only compared with, and method names the papers use do not
    trigger this."""
    for question in (
        "How does FlashAttention tile the attention computation to save memory?",
        "How does HyperZeta-Net compress vision transformers?",
        "What BLEU score did the original Transformer get on WMT 2014 English-German?",
    ):
        answer = seed_rag.ask(question)
        assert answer.abstained and answer.answer.startswith(REFUSAL), question
        assert answer.citations == [] and answer.sources
    for question in (
        "Which paper by Cotnareanu does abductive reasoning with commonsense?",
        "Is there a paper like DreamBooth but for crystal structure generation?",
        "How does Palimpsa relate to Mamba2?",
    ):
        answer = seed_rag.ask(question)
        assert not answer.abstained and answer.citations, question


def test_stream_yields_text_then_answer(seed_rag):
    stream = seed_rag.stream("predictive coding on digital hardware")
    pieces = list(stream)
    assert pieces and all(isinstance(p, str) for p in pieces)
    assert isinstance(stream.answer, Answer)
    assert "".join(pieces) == stream.answer.answer


def test_chat_rewrites_a_follow_up(seed_rag):
    history = [
        {"role": "user", "content": "What is Palimpsa?"},
        {"role": "assistant", "content": "A self-attention model [1]."},
    ]
    answer = seed_rag.chat("what about its relation to Mamba2?", history)
    assert answer.sources[0].paper_id == "wKMV7mXjUr"


def test_query_engine_is_a_llamaindex_engine(seed_rag):
    from llama_index.core.base.base_query_engine import BaseQueryEngine

    from rag.answer.citations import plain_text

    engine = seed_rag.query_engine
    assert isinstance(engine, BaseQueryEngine)
    response = engine.query("debiasing attention heads in CLIP")
    answer = response.metadata["answer"]
    assert str(response).startswith(plain_text(answer.answer)) and "References:" in str(response)
    assert (
        response.source_nodes[0].node.metadata["paper_id"]
        == answer.sources[0].paper_id
        == "Sd5KwQbOdd"
    )


@pytest.mark.parametrize(
    "question, message",
    [
        ("", "the question is empty"),
        ("   \n\t ", "the question is empty"),
        ("x" * 5000, "keep it under 2000"),
        (None, "the question must be text"),
    ],
)
def test_bad_questions(seed_rag, question, message):
    with pytest.raises(InputError, match=message):
        seed_rag.ask(question)


def test_control_characters_are_cleaned(seed_rag):
    answer = seed_rag.ask("Palimpsa\x00\x07 and Mamba2\x1b[2J?")
    assert answer.question == "Palimpsa and Mamba2?"  # the escape sequence goes whole
    assert answer.sources[0].paper_id == "wKMV7mXjUr"


def test_invalid_setting_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="invalid setting top_k"):
        RAG(store_dir=tmp_path, top_k=0)
    # Settings, the API and the CLI share one check of k: an over-range k names the limit.
    with pytest.raises(
        InputError, match="invalid setting top_k: .*k must be between 1 and 100, got 101"
    ):
        RAG(store_dir=tmp_path, top_k=101)
    with pytest.raises(InputError, match="invalid setting mode: .*unknown retrieval mode 'fuzzy'"):
        RAG(store_dir=tmp_path, mode="fuzzy")


def test_module_level_ask_uses_the_default_store(seed_store, monkeypatch):
    monkeypatch.setenv("RAG_STORE_DIR", str(seed_store))
    monkeypatch.setattr(rag, "_engines", {})
    answer = rag.ask("debiasing attention heads in CLIP", llm=False)
    assert answer.sources[0].paper_id == "Sd5KwQbOdd"
    assert rag.search("Palimpsa", k=1)[0].paper_id == "wKMV7mXjUr"


def test_module_level_ask_takes_settings(seed_store, tmp_path, monkeypatch):
    monkeypatch.setattr(rag, "_engines", {})
    settings = rag.Settings(store_dir=seed_store, top_k=2)
    answer = rag.ask("debiasing attention heads in CLIP", settings=settings, llm=False)
    assert answer.sources[0].paper_id == "Sd5KwQbOdd" and len(answer.sources) == 2
    assert [s.paper_id for s in rag.search("Palimpsa", settings=settings)][:1] == ["wKMV7mXjUr"]
    assert len(rag._engines) == 1  # the same settings reuse one engine
    with pytest.raises(rag.StoreError, match="there is no index at"):
        rag.ask("Palimpsa", settings=rag.Settings(store_dir=tmp_path / "missing"))


def test_every_type_the_api_returns_is_exported(seed_rag, tmp_path, small_corpus):
    assert isinstance(seed_rag.stream("What is Palimpsa?"), rag.AnswerStream)
    assert isinstance(seed_rag.embedder, rag.Embedder)
    # the report's type is the point, not the model: no ONNX load
    from rag.testing import HashEmbedder

    report = RAG(store_dir=tmp_path / "s", embedder=HashEmbedder()).ingest(
        [small_corpus], include_corpus=False
    )
    assert isinstance(report, rag.IngestReport) and report.new_papers == 3


def test_extractive_sources_carry_their_quoted_sentences_as_evidence(seed_rag):
    answer = seed_rag.ask("How does Palimpsa relate to Mamba2?")
    palimpsa = answer.sources[0]
    assert palimpsa.evidence and all(e in answer.answer for e in palimpsa.evidence)
    # the JSON shape stays the contract's
    assert "evidence" not in answer.model_dump()["sources"][0]


def test_follow_up_after_a_long_question_stays_valid(seed_rag):
    history = [
        {"role": "user", "content": "Palimpsa " + "attention " * 240},
        {"role": "assistant", "content": "..."},
    ]
    answer = seed_rag.chat("and its relation to Mamba2?", history)
    assert answer.sources[0].paper_id == "wKMV7mXjUr"


def test_brackets_in_quoted_abstracts_stay_text(tmp_path):
    """An abstract's own "[1]" or "W[1]-hard" is quoted verbatim (escaped), never a live
    citation."""
    from tests.conftest import write_jsonl

    rows = [
        {
            "id": "BRACKETS01",
            "title": "Parameterized hardness of sparse attention",
            "abstract": (
                "We prove that sparse attention selection is W[1]-hard under standard assumptions"
                " [1]. Scores in [0,1] are attained by a greedy rule with a provable approximation"
                " ratio."
            ),
            "url": "https://openreview.net/forum?id=BRACKETS01",
        },
        {
            "id": "OTHERPAPR2",
            "title": "Graph neural networks for molecules",
            "abstract": (
                "Graph neural networks predict molecular properties from atom and bond features."
            ),
            "url": "https://openreview.net/forum?id=OTHERPAPR2",
        },
    ]
    engine = RAG(store_dir=tmp_path / "store", llm="none")
    engine.ingest([write_jsonl(tmp_path / "b.jsonl", rows)], include_corpus=False)
    answer = engine.ask("Is sparse attention selection W[1]-hard?")
    assert not answer.abstained
    cited = {s.n: s.paper_id for s in answer.sources if s.cited}
    assert set(parse_markers(answer.answer)) == set(cited) == {c.n for c in answer.citations}
    assert cited[1] == "BRACKETS01"
    shown = plain_text(answer.answer)
    assert "W[1]-hard" in shown and "assumptions [1]." in shown
