"""Retrieval over the real seed index: the right paper for a dozen questions, each paper once."""

from __future__ import annotations

import pytest

from rag.errors import InputError

QUESTIONS = [
    ("How does Palimpsa relate to Mamba2?", "wKMV7mXjUr"),
    (
        "backdoor attacks on fine-tuned language models and which attention heads process them",
        "wG7woGoc1b",
    ),
    (
        "generating inorganic crystal materials with a preference-aligned language model",
        "wFThVGzmvq",
    ),
    ("predictive coding that runs fast on digital hardware", "vNPkcJj46N"),
    ("vehicle routing solver optimized with preferences over multiple tasks", "vJsJPNRFIJ"),
    ("does quantization-aware fine-tuning break safety alignment?", "vF2Xhg2s31"),
    (
        "do audio language models listen to paralinguistic cues or just read transcripts",
        "v7rYbRR9Zw",
    ),
    ("defenses against memory poisoning in LLM agents", "udqe7UZUZ6"),
    ("which properties predict whether merging two models will succeed", "uFQwehcepH"),
    ("federated learning with heterogeneous data and models using anchors", "qQhTbQSHdG"),
    ("image super resolution with hierarchical tokenization at multiple scales", "prZKQmxXmq"),
    ("when should Bayesian optimization stop if evaluations cost money", "o1Tn2ie0Wy"),
    ("debiasing attention heads in CLIP", "Sd5KwQbOdd"),
]


@pytest.mark.parametrize("question, paper_id", QUESTIONS)
def test_right_paper_first(seed_rag, question, paper_id):
    sources = seed_rag.search(question, k=5)
    assert sources[0].paper_id == paper_id, [s.title for s in sources]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "hybrid-rrf", "hybrid-convex"])
def test_each_mode_finds_palimpsa_and_lists_each_paper_once(seed_rag, mode):
    sources = seed_rag.search("Palimpsa Bayesian metaplasticity attention", k=10, mode=mode)
    ids = [s.paper_id for s in sources]
    assert ids[0] == "wKMV7mXjUr"
    assert len(ids) == len(set(ids))
    # BM25 lists only papers that share a word with the query; the others fill all 10.
    assert len(ids) == 10 if mode != "bm25" else 5 <= len(ids) <= 10
    # Scores are each passage's similarity to the question (comparable across questions), so they
    # need not fall with the rank that fusion gave.
    assert all(0.0 <= s.score <= 1.0 for s in sources)
    assert [s.n for s in sources] == list(range(1, len(ids) + 1))


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "hybrid-rrf", "hybrid-convex"])
def test_each_result_says_what_its_place_is_made_of(seed_rag, mode):
    """Results are listed by `retrieval.rank`, which follows `retrieval.fused` (never rising down
    the list); the cosine and keyword matches beside it are the passage's own, whatever the order.
    """
    query = "debiasing CLIP attention heads"
    sources = seed_rag.search(query, k=8, mode=mode)
    scores = [s.retrieval for s in sources]
    assert all(r is not None for r in scores)
    assert [r.rank for r in scores] == [s.n for s in sources] == list(range(1, len(sources) + 1))
    fused = [r.fused for r in scores]
    assert fused == sorted(fused, reverse=True) and 0.0 <= fused[-1] and fused[0] <= 1.0
    keyword = seed_rag.store.keyword_index()
    rowids = {
        c.text: rowid
        for rowid, c in seed_rag.store.chunks_by_rowid([int(k) for k in keyword.keys]).items()
    }
    bm25 = keyword.scores_of(query, [rowids[s.passage] for s in sources])
    for s in sources:
        # the score shown is the cosine, held to 0..1
        assert min(1.0, max(0.0, s.retrieval.cosine)) == pytest.approx(s.score, abs=1e-4)
        assert s.retrieval.keyword == pytest.approx(bm25[rowids[s.passage]], abs=1e-3)
    assert (
        sources[0].scores_label().startswith("fused ") and " · cosine " in sources[0].scores_label()
    )


def test_top_k_and_passages_carry_title(seed_rag):
    sources = seed_rag.search("model merging", k=3)
    assert len(sources) == 3
    assert all(s.passage.startswith(s.title) for s in sources)


def test_llamaindex_retriever_composes(seed_rag):
    from llama_index.core.base.base_retriever import BaseRetriever

    retriever = seed_rag.retriever
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve("debiasing attention heads in CLIP")
    assert nodes[0].node.metadata["paper_id"] == "Sd5KwQbOdd"
    assert len(nodes) == seed_rag.settings.top_k


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "fuzzy"}, "unknown retrieval mode 'fuzzy'"),
        ({"k": 0}, "k must be between 1 and 100"),
        ({"k": 101}, "k must be between 1 and 100"),
        ({"k": -3}, "k must be between 1 and 100"),
        ({"k": "5"}, "k must be a whole number"),
    ],
)
def test_bad_arguments_are_clear_errors(seed_rag, kwargs, message):
    with pytest.raises(InputError, match=message):
        seed_rag.search("attention", **kwargs)


def test_the_largest_k_is_capped_to_the_corpus(seed_rag):
    assert len(seed_rag.search("attention", k=100)) == 76


def test_keyword_tokens_fold_plurals_but_not_acronyms():
    from rag.text import keyword_terms

    assert keyword_terms("PACS and PAC bounds") == ["pacs", "pac", "bound"]
    assert keyword_terms("LLMs, GNNs and models") == ["llm", "gnn", "model"]
    assert keyword_terms("in-context learning") == [
        "in-context",
        "context",
        "incontext",
        "learning",
    ]
    # A possessive is the name's term ("Palimpsa's main idea" found no Palimpsa); other
    # apostrophes stay inside the word.
    assert keyword_terms("Palimpsa's model's LLM's") == ["palimpsa", "model", "llm"]
    assert keyword_terms("don't O'Brien") == ["don't", "o'brien"]


def test_convex_fusion_weighs_scaled_scores_and_boosts_rare_names():
    """Logic of the score arithmetic on hand-made candidate lists (a unit test: no index can pin
    these numbers). Min-max scaling per list, the dense share, a missing list counting 0, and the
    rare-name boost only for keyword matches."""
    from rag.retrieve.search import convex_fusion

    dense = [(1, 0.80), (2, 0.60), (3, 0.40)]  # scaled 1, 0.5, 0
    keyword = [(3, 12.0), (4, 6.0), (2, 0.0)]  # scaled 1, 0.5, 0
    fused, best = convex_fusion(dense, keyword, set(), dense_weight=0.6, name_boost=2.0)
    assert fused == pytest.approx({1: 0.6, 2: 0.3, 3: 0.4, 4: 0.2})
    assert best == 1.0
    fused, best = convex_fusion(dense, keyword, {4, 1}, dense_weight=0.6, name_boost=2.0)
    # 1 holds no keyword match
    assert fused[4] == pytest.approx(1.2) and fused[1] == pytest.approx(0.6)
    assert best == 2.0
    fused, _ = convex_fusion([(5, 0.5)], [], set(), dense_weight=0.6, name_boost=2.0)
    assert fused == {5: pytest.approx(0.6)}  # one candidate: scaled to 1


def test_hybrid_fusion_follows_the_embedding_model_unless_the_mode_names_one():
    from rag.retrieve.search import fusion_for

    assert fusion_for("hybrid", "all-MiniLM-L6-v2") == "rrf"
    assert fusion_for("hybrid", "all-mpnet-base-v2") == "convex"
    assert fusion_for("hybrid-rrf", "all-mpnet-base-v2") == "rrf"
    assert fusion_for("hybrid-convex", "all-MiniLM-L6-v2") == "convex"
    assert (
        fusion_for("dense", "all-MiniLM-L6-v2") is None
        and fusion_for("bm25", "all-mpnet-base-v2") is None
    )


@pytest.mark.parametrize("question, paper_id", QUESTIONS[:6])
def test_convex_fusion_finds_the_right_paper_too(seed_store, question, paper_id):
    from rag import RAG

    rag = RAG(store_dir=seed_store, llm="none")
    sources = rag.search(question, k=5, mode="hybrid-convex")
    assert sources[0].paper_id == paper_id, [s.title for s in sources]
    assert all(0.0 <= s.score <= 1.0 for s in sources)


def test_unknown_names_are_names_no_indexed_text_contains():
    from rag.index.keyword import KeywordIndex

    index = KeywordIndex.build(
        [
            (
                1,
                "Palimpsa: a $\\textit{S}$-SPPO variant of Mamba2 trained with GRPO on ImageNet-1K",
            ),
            (2, "Word embeddings and attention on 8 GPUs"),
        ]
    )
    assert index.unknown_names("How does Palimpsa relate to Mamba2?") == []
    assert index.unknown_names("Is S-SPPO trained with GRPO-style rewards on ImageNet-1K?") == []
    assert index.unknown_names("How does FlashAttention use GPUs, and what is word2vec?") == [
        "FlashAttention",
        "word2vec",
    ]
    # amounts, not names
    assert index.unknown_names("Does it reach 93.5% with 2x fewer steps in 2026?") == []
    assert index.unknown_names("Does it hold for U.S. data, as in Go?") == []  # too short to judge
    # compared with
    assert index.unknown_names("Is there a model like DreamBooth, or faster than FooNet?") == []
