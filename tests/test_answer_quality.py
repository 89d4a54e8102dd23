"""Answer quality with a model that can answer: the local default, Qwen2.5-Coder-1.5B-Instruct from
the `[local]` extra, in-process (what `RAG_LLM=local` runs), over the 76 seeds, at the default
answer settings (evidence-first).

Three questions: the README's example, a number, a topic no paper covers (a paraphrase, a keyword
question and a second uncovered topic were dropped, as each local-model answer costs 30-65 s on a
busy CI machine): ones the default engine answers in the bench run, which is deterministic at
temperature 0, so a regression anywhere on the answer path (prompt, reading the reply, quotes,
markers, support check) fails them. How often the engine answers or holds back across a whole set is
what bench/answers/quality.py measures (docs/answers.md), not these tests. The model's wording is
not asserted; what a reader relies on is: an answer that cites the paper it comes from, every marker
pointing at a listed source, the gold citation marked supported, the key number where the question
asks for one, and, where no indexed paper covers the question, nothing that its sources do not say:
a refusal, or sentences quoted exactly from the papers cited.

The model runs on one llama.cpp thread: the other pytest-xdist worker keeps the other core busy, and
two spinning threads then collide (an answer took 53 s on two threads and 16 s on one at load 10).
The thread count changes how fast the model reads and writes, not what it writes.
"""

from __future__ import annotations

import json
import re

import pytest

from rag import RAG
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

QUESTIONS = {
    json.loads(line)["id"]: json.loads(line)
    for name in ("seed_questions", "not_covered_questions")
    for line in (REPO / "eval" / f"{name}.jsonl").read_text().splitlines()
    if line.strip()
}


@pytest.fixture(scope="module")
def qwen_rag(seed_store):
    """The defaults with RAG_LLM=local and no RAG_LOCAL_MODEL_PATH (conftest turns the withdrawal of
    free answers off for the tiny model; it is turned back on here)."""
    from rag.backends.modelfiles import qwen_parts
    from tests.servers import _unavailable

    if qwen_parts() is None:
        _unavailable("the [local] extra (Qwen2.5-Coder-1.5B-Instruct) is not installed")
    return RAG(store_dir=seed_store, llm="local", llm_threads=1, llm_require_support=True)


def _check_markers(answer) -> None:
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", answer.answer)}
    assert markers == {s.n for s in answer.sources if s.cited} == {c.n for c in answer.citations}
    assert answer.removed_markers == []


def test_the_readme_example_answers_with_the_local_default_model(qwen_rag):
    """The README's example, `RAG_LLM=local rag ask "How does Palimpsa relate to Mamba2?"`: the
    model is Qwen (assembled into the model cache from the extra's parts); the answer cites the
    Palimpsa paper first and quotes the sentence that answers (Mamba2 is a special case of
    Palimpsa), every citation supported. It was refused before. `rag ask --json` with an LLM is
    tested in tests/test_llm.py, and `RAG_LLM=local` through the CLI in tests/test_doctor.py (which
    loads this model)."""
    answer = qwen_rag.ask("How does Palimpsa relate to Mamba2?")
    assert qwen_rag.llm.label.startswith("qwen2.5-coder-1.5b-instruct"), qwen_rag.llm.label
    assert qwen_rag.llm.label.endswith("(local, llama-cpp-python)")
    assert (answer.outcome, answer.mode, answer.error) == ("answered", "llm", None), answer.answer
    assert answer.cited_sources[0].paper_id == "wKMV7mXjUr" and answer.cited_sources[0].n == 1
    assert "Mamba2 is a special case of Palimpsa" in answer.answer
    assert answer.citations and all(c.supported for c in answer.citations), answer.answer
    _check_markers(answer)


@pytest.mark.parametrize("qid", ["n17"])
def test_answerable_question_is_answered_from_the_paper_it_cites(qwen_rag, qid):
    row = QUESTIONS[qid]
    answer = qwen_rag.ask(row["question"])
    assert answer.error is None and answer.mode == "llm" and answer.outcome == "answered", (
        answer.answer
    )
    cited = [s.paper_id for s in answer.sources if s.cited]
    assert row["gold"][0] in cited, (answer.answer, cited)
    _check_markers(answer)
    gold_n = next(s.n for s in answer.sources if s.paper_id == row["gold"][0])
    assert next(c for c in answer.citations if c.n == gold_n).supported, answer.answer
    if row["kind"] == "numeric":
        assert any(f in answer.answer for f in row["key_facts"]), answer.answer


@pytest.mark.parametrize("qid", ["c20"])
def test_question_no_indexed_paper_covers_gets_nothing_its_sources_do_not_say(qwen_rag, qid):
    from rag.answer.citations import plain_text
    from rag.answer.evidence import source_sentences

    stream = qwen_rag.stream(QUESTIONS[qid]["question"])
    pieces = list(stream)
    answer = stream.answer
    assert answer.error is None and len(answer.sources) == 5, answer.answer
    if answer.outcome != "answered":
        assert answer.abstained and "".join(pieces).strip().endswith(answer.answer.strip()[-40:])
        assert all(c.supported for c in answer.citations)
        return
    # Answered: the papers it found on the nearest topic, in their own words, each citation
    # supported.
    assert answer.citations and all(c.supported for c in answer.citations), answer.answer
    cited = {
        s.n: (s.title, " ".join(source_sentences(s.passage))) for s in answer.sources if s.cited
    }
    for line in plain_text(answer.answer).splitlines():
        # "- sentence [n]", or "- Title: sentence [n]" in a list of papers
        if line.startswith("- "):
            n = int(re.search(r"\[(\d+)\]$", line).group(1))
            title, text = cited[n]
            quote = re.sub(r"\s*\[\d+\]$", "", line[2:]).removeprefix(f"{title}: ")
            assert quote in text, line
