"""`rag.testing`: the stand-in models an app (and this suite's plumbing tests) builds on. The
pipeline around them is real: the seed corpus ingested into Chroma on disk, BM25, fusion, citation
numbering, streaming."""

from __future__ import annotations

import math

import pytest

from rag import RAG, Answer, LLMError
from rag.testing import HashEmbedder, ScriptedChat

Q = "How does Palimpsa relate to Mamba2?"


def test_hash_vectors_are_unit_deterministic_and_closer_for_shared_words():
    e = HashEmbedder()
    a, b = e.embed(["attention with metaplasticity", "metaplasticity in attention models"])
    c = e.embed_query("a recipe for chocolate cake")
    assert all(math.isclose(sum(v * v for v in vec), 1.0, rel_tol=1e-9) for vec in (a, b, c))
    assert HashEmbedder().embed(["attention with metaplasticity"])[0] == a
    cos = lambda x, y: sum(p * q for p, q in zip(x, y))  # noqa: E731
    assert cos(a, b) > 0.3 > abs(cos(a, c))
    assert e.embed([""])[0] == [1.0] + [0.0] * (e.dim - 1)
    assert e.count_tokens(["one two three"]) == [5]


@pytest.fixture(scope="module")
def hashed(tmp_path_factory) -> RAG:
    rag = RAG(store_dir=tmp_path_factory.mktemp("hashed"), embedder=HashEmbedder(), llm="none")
    assert rag.ingest().new_papers == 76
    return rag


def test_the_seeds_index_and_the_asked_paper_is_found_without_a_model(hashed):
    assert hashed.stats()["embedding_model"] == "test-hash-embedder"
    assert [s.paper_id for s in hashed.search(Q, k=3)][0] == "wKMV7mXjUr"


def test_a_scripted_answer_goes_through_citations_and_streaming(hashed):
    chat = ScriptedChat("Palimpsa treats Mamba2 as a special case where forgetting dominates [1].")
    rag = RAG(
        store_dir=hashed.settings.store_dir,
        embedder=HashEmbedder(),
        llm=chat,
        answer_style="free",
        llm_require_support=False,
    )
    stream = rag.stream(Q)
    pieces = list(stream)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.mode == "llm" and not answer.abstained
    assert "".join(pieces) == answer.answer and len(pieces) > 3
    assert [c.n for c in answer.citations] == [1] and answer.sources[0].cited
    assert answer.sources[0].paper_id == "wKMV7mXjUr"
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    kinds = [kind for kind, _ in chat.calls]
    assert "stream" in kinds
    prompt = next(m for kind, m in chat.calls if kind == "stream")
    # the sources reached the model
    assert any("Palimpsa" in message["content"] for message in prompt)


def test_a_reply_can_depend_on_the_prompt_and_a_stream_can_break(hashed):
    seen = []
    chat = ScriptedChat(lambda messages: seen.append(messages) or "Nothing here [1].")
    assert chat.complete([{"role": "user", "content": "hi"}]) == "Nothing here [1]."
    assert seen == [[{"role": "user", "content": "hi"}]]
    broken = ScriptedChat("one two three four", fail_after=2)
    with pytest.raises(LLMError):
        list(broken.stream([{"role": "user", "content": "q"}]))
