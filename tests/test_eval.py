"""`rag eval`: metric functions against hand-computed values, aggregation, question-file checks, the
CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from rag.errors import InputError
from rag.evaluation import (
    UNANSWERABLE_SUBKINDS,
    AnswerFigures,
    EvalReport,
    Figure,
    QuestionResult,
    abstention_precision_recall,
    citation_precision,
    evaluate,
    hit_at,
    interval95,
    key_fact_recall,
    load_questions,
    mean,
    metric_parts,
    mrr,
    ndcg_at,
    normalize_fact_text,
    recall_at,
    render_markdown,
    retrieval_scores,
    share,
    side_by_side,
)
from tests.conftest import REPO, run_cli, write_jsonl

RANKED = list("abcdefghijk")  # 11 papers, best first


# ---- metric functions ------------------------------------------------------------------------


def test_hit_at():
    assert hit_at(RANKED, {"c", "x"}, 1) == 0.0
    assert hit_at(RANKED, {"c", "x"}, 3) == 1.0
    assert hit_at(RANKED, {"c", "x"}, 2) == 0.0
    assert hit_at(RANKED, ["a"], 1) == 1.0
    assert hit_at(RANKED, ["k"], 10) == 0.0  # rank 11
    assert hit_at([], ["a"], 5) == 0.0


def test_mrr():
    assert mrr(RANKED, {"c", "x"}) == pytest.approx(1 / 3)
    assert mrr(RANKED, ["e", "b"]) == pytest.approx(1 / 2)  # the first gold paper counts
    assert mrr(RANKED, ["a"]) == 1.0
    assert mrr(RANKED, ["j"]) == pytest.approx(1 / 10)
    assert mrr(RANKED, ["k"]) == 0.0  # rank 11 is outside the top 10
    assert mrr(RANKED, ["zz"]) == 0.0


def test_recall_at():
    assert recall_at(RANKED, {"c", "x"}, 5) == 0.5
    assert recall_at(RANKED, ["a", "c", "g", "zz"], 5) == 0.5
    assert recall_at(RANKED, ["a", "c", "g", "zz"], 10) == 0.75
    assert recall_at(RANKED, ["k"], 10) == 0.0
    with pytest.raises(ValueError):
        recall_at(RANKED, [], 5)


def test_ndcg_at():
    # One relevant of two at rank 3: (1/log2 4) / (1/log2 2 + 1/log2 3) = 0.5 / 1.6309298 =
    # 0.3065736
    assert ndcg_at(RANKED, {"c", "x"}) == pytest.approx(0.3065736, abs=1e-7)
    # Ranks 1, 3, 5 of three: (1 + 0.5 + 1/log2 6) / (1 + 1/log2 3 + 0.5) = 1.8868528 / 2.1309298
    assert ndcg_at(RANKED, ["a", "c", "e"]) == pytest.approx(0.8854598, abs=1e-7)
    assert ndcg_at(RANKED, ["a"]) == 1.0
    assert ndcg_at(RANKED, ["a", "b"]) == 1.0
    assert ndcg_at(RANKED, ["k"]) == 0.0
    # More gold papers than k: the ideal ranking is capped at k, so a perfect top 10 scores 1.
    assert ndcg_at(RANKED, list("abcdefghijklmn")) == pytest.approx(1.0)
    assert ndcg_at(RANKED, ["b"], k=1) == 0.0


def test_retrieval_scores_bundle():
    scores = retrieval_scores(RANKED, ["c", "x"])
    assert scores == pytest.approx(
        {
            "hit@1": 0.0,
            "hit@5": 1.0,
            "mrr": 1 / 3,
            "recall@5": 0.5,
            "recall@10": 0.5,
            "ndcg@10": 0.5 / (1 + 1 / math.log2(3)),
        }
    )


def test_key_fact_recall():
    answer = "- We show that Mamba2 is a special case of Palimpsa where forgetting dominates. [1]"
    assert (
        key_fact_recall(answer, ["mamba2 IS a special case of palimpsa", "forgetting dominates"])
        == 1.0
    )
    assert key_fact_recall(
        answer, ["forgetting dominates", "not in there", "also missing"]
    ) == pytest.approx(1 / 3)
    # Abstracts carry LaTeX; key facts were written without it.
    assert key_fact_recall(r"cuts attack success rates by over 95\% while", ["95%"]) == 1.0
    assert key_fact_recall(r"ablating a minimal \textbf{$\sim$ 3%} of heads", ["3%", "~ 3%"]) == 1.0
    assert (
        key_fact_recall("treats each header–value pair as the unit", ["header-value  PAIR"]) == 1.0
    )
    with pytest.raises(ValueError):
        key_fact_recall("text", [])
    assert normalize_fact_text("  A\n B ") == "a b"


def test_citation_precision():
    assert citation_precision(["a", "b"], ["a"]) == 0.5
    assert citation_precision(["a", "b", "a"], ["a"]) == 0.5  # a paper counts once
    assert citation_precision(["a"], ["a", "b"]) == 1.0
    assert citation_precision(["x", "y", "z"], ["a"]) == 0.0
    assert citation_precision([], ["a"]) is None


def test_abstention_precision_recall():
    assert abstention_precision_recall([True, True, False, False], [True, False, True, False]) == (
        0.5,
        0.5,
    )
    assert abstention_precision_recall([True, False, False], [True, True, True]) == (
        1.0,
        pytest.approx(1 / 3),
    )
    assert abstention_precision_recall([False, False], [True, False]) == (None, 0.0)
    assert abstention_precision_recall([True], [False]) == (0.0, None)
    with pytest.raises(ValueError):
        abstention_precision_recall([True], [])


def test_mean_and_share():
    assert mean([1.0, None, 0.0]) == 0.5
    assert mean([None]) is None and mean([]) is None
    assert share([True, False, False, True]) == 0.5
    assert share([]) is None


# ---- aggregation, with a scripted engine ---------------------------------------------------------


class _FakeRAG:
    """Stands in for `RAG`: scripted rankings and answers, so the aggregation is checked by hand."""

    def __init__(self, rankings: dict[str, list[str]], answers: dict[str, dict], papers: set[str]):
        self.rankings, self.answers, self.known = rankings, answers, papers
        self.settings = SimpleNamespace(mode="hybrid", top_k=5)
        self.store = SimpleNamespace(
            papers=lambda ids: {i: object() for i in ids if i in self.known}
        )
        self.calls: list[tuple] = []

    def ensure_index(self, progress=False):
        pass

    def search(self, question, k, mode):
        self.calls.append(("search", question, k, mode))
        return [SimpleNamespace(paper_id=p) for p in self.rankings[question][:k]]

    def ask(self, question, k, mode):
        self.calls.append(("ask", question, k, mode))
        a = self.answers[question]
        sources = [
            SimpleNamespace(paper_id=p, cited=p in a["cited"]) for p in self.rankings[question][:k]
        ]
        citations = [
            SimpleNamespace(supported=s) for s in a.get("supported", [True] * len(a["cited"]))
        ]
        return SimpleNamespace(
            answer=a["text"],
            abstained=a.get("abstained", False),
            mode="extractive",
            error=None,
            sources=sources,
            citations=citations,
        )


def _fake():
    questions = [
        {
            "id": "k1",
            "question": "q1",
            "gold": ["a"],
            "kind": "keyword",
            "key_facts": ["alpha", "beta"],
        },
        {"id": "k2", "question": "q2", "gold": ["b"], "kind": "keyword", "key_facts": ["gamma"]},
        {"id": "m1", "question": "q3", "gold": ["a", "c"], "kind": "multi", "key_facts": []},
        {"id": "u1", "question": "q4", "gold": [], "kind": "unanswerable", "key_facts": []},
        {"id": "u2", "question": "q5", "gold": [], "kind": "unanswerable", "key_facts": []},
        {"id": "x1", "question": "q6", "gold": ["zz"], "kind": "odd", "key_facts": []},
    ]
    rankings = {
        "q1": ["a", "b", "c"],
        "q2": ["a", "c", "b"],
        "q3": ["c", "x", "a"],
        "q4": ["a"],
        "q5": ["b"],
        "q6": ["a", "b"],
    }
    answers = {
        # facts 1/2, precision 1/2
        "q1": {"text": "Alpha and more.", "cited": ["a", "b"]},
        # facts 0, no precision
        "q2": {"text": "", "cited": [], "abstained": True},
        "q3": {"text": "x", "cited": ["c"], "supported": [False]},  # precision 1
        "q4": {"text": "none", "cited": [], "abstained": True},
        "q5": {"text": "b says", "cited": ["b"]},
        "q6": {"text": "y", "cited": ["a"]},  # precision 0
    }
    return _FakeRAG(rankings, answers, papers={"a", "b", "c", "x"}), questions


def test_evaluate_aggregates_by_kind_by_hand():
    rag, questions = _fake()
    report = evaluate(rag, questions, ["bm25", "hybrid", "bm25"], k=3)
    assert isinstance(report, EvalReport)
    assert isinstance(report.modes["bm25"].answers["overall"], AnswerFigures)
    result = report.to_dict()
    assert list(result["modes"]) == ["bm25", "hybrid"]  # repeated modes run once
    assert result["questions"] == 6 and result["retrieval_k"] == 10 and result["answer_k"] == 3
    # unknown kind kept, by name
    assert list(result["kinds"]) == ["keyword", "multi", "unanswerable", "odd"]
    assert result["kinds"]["unanswerable"] == {"questions": 2, "with_gold": 0, "with_key_facts": 0}
    assert result["missing_gold"] == {"x1": ["zz"]}
    assert ("search", "q1", 10, "bm25") in rag.calls and ("ask", "q1", 3, "hybrid") in rag.calls
    ret = result["modes"]["bm25"]["retrieval"]
    assert "unanswerable" not in ret  # no gold, no retrieval metrics
    assert ret["keyword"]["hit@1"] == 0.5 and ret["keyword"]["mrr"] == pytest.approx(
        (1 + 1 / 3) / 2
    )
    # multi: c at 1, a at 3 -> DCG 1 + 0.5, ideal 1 + 1/log2 3
    assert ret["multi"]["ndcg@10"] == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert ret["multi"]["recall@5"] == 1.0 and ret["odd"]["hit@5"] == 0.0
    # overall over the 4 questions with gold: hit@1 = (1 + 0 + 1 + 0) / 4
    assert ret["overall"]["hit@1"] == 0.5
    assert ret["overall"]["mrr"] == pytest.approx((1 + 1 / 3 + 1 + 0) / 4)
    ans = result["modes"]["bm25"]["answers"]
    assert ans["keyword"] == {
        "key_fact_recall": 0.25,
        "citation_precision": 0.5,
        "abstained": 0.5,
        "supported_citations": 1.0,
    }
    assert ans["multi"]["key_fact_recall"] is None and ans["multi"]["supported_citations"] == 0.0
    assert (
        ans["unanswerable"]["abstained"] == 0.5
        and ans["unanswerable"]["citation_precision"] is None
    )
    overall = ans["overall"]
    assert overall["key_fact_recall"] == 0.25
    assert overall["citation_precision"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert overall["abstention_precision"] == 0.5 and overall["abstention_recall"] == 0.5
    assert overall["abstained"] == pytest.approx(2 / 6)
    # a, b (q1), b (q5), a (q6) supported; c not
    assert overall["supported_citations"] == pytest.approx(4 / 5)
    assert result["modes"]["bm25"]["answerer"] == "extractive"
    # The typed figures say how many items each value averages over.
    figures = report.modes["bm25"]
    assert figures.retrieval["overall"].hit_at_1 == Figure(0.5, n=4)  # no interval without ci
    assert figures.answers["overall"].supported_citations.n == 5  # citations
    assert figures.answers["overall"].abstention_precision.n == 2  # abstentions
    # overall only, and absent from the JSON
    assert figures.answers["keyword"].abstention_precision is None


def test_evaluate_without_answers_and_markdown():
    rag, questions = _fake()
    result = evaluate(rag, questions, ["dense"], answers=False)
    assert result.modes["dense"].answers is None and result.answer_k is None
    assert "answerer" not in result.to_dict()["modes"]["dense"]
    assert not any(call[0] == "ask" for call in rag.calls)
    text = render_markdown(result)
    assert "| kind | metric | dense |" in text and "answers not evaluated" in text
    assert "| keyword (2) | hit@1 | 0.500 |" in text and "| odd (1) | hit@1 | 0.000 |" in text


def test_markdown_bolds_the_best_mode():
    rag, questions = _fake()
    rag.rankings["q2"] = ["b"]  # both keyword questions hit at 1 in every mode
    result = evaluate(rag, questions, ["bm25", "hybrid"])
    hybrid = result.modes["hybrid"]
    keyword = replace(hybrid.retrieval["keyword"], hit_at_1=Figure(0.25, n=2))
    hybrid = replace(hybrid, retrieval={**hybrid.retrieval, "keyword": keyword})
    text = render_markdown(replace(result, modes={**result.modes, "hybrid": hybrid}))
    assert "| keyword (2) | hit@1 | **1.000** | 0.250 |" in text
    assert "abstention precision" in text and "abstention recall" in text


def test_side_by_side_puts_each_store_and_mode_in_a_column():
    """Two stores' reports of one question set (fakes standing in for two embedding models): one
    report, a column per store and mode, each store's figures as it measured them, every store's
    missing gold."""
    small, questions = _fake()
    large, _ = _fake()
    large.rankings["q2"] = ["b"]  # the second store ranks q2's gold first
    large.known.discard("c")  # and lacks paper c
    reports = {
        "small": evaluate(small, questions, ["bm25", "hybrid"], answers=False),
        "large": evaluate(large, questions, ["bm25"], answers=False),
    }
    report = side_by_side(reports)
    assert list(report.modes) == ["small bm25", "small hybrid", "large bm25"]
    assert report.modes["small bm25"].retrieval["keyword"].hit_at_1.value == 0.5
    assert report.modes["large bm25"].retrieval["keyword"].hit_at_1.value == 1.0
    assert report.missing_gold == {"x1": ("zz",), "m1": ("c",)}
    assert report.questions == 6 and report.kinds == reports["small"].kinds
    assert "| kind | metric | small bm25 | small hybrid | large bm25 |" in render_markdown(report)
    with pytest.raises(ValueError):
        side_by_side({})


def test_evaluate_lists_each_question_with_the_rank_of_its_gold():
    rag, questions = _fake()
    result = evaluate(rag, questions, ["bm25"], answers=False)
    listed = {q["id"]: q for q in result.to_dict()["modes"]["bm25"]["questions"]}
    assert list(listed) == ["k1", "k2", "m1", "u1", "u2", "x1"]
    # ranking a, c, b; gold b
    assert listed["k1"]["gold_rank"] == 1 and listed["k2"]["gold_rank"] == 3
    assert listed["m1"]["gold_rank"] == 1 and listed["x1"]["gold_rank"] is None
    assert listed["u1"] == {
        "id": "u1",
        "kind": "unanswerable",
        "gold": [],
        "ranked": ["a"],
        "gold_rank": None,
    }
    text = render_markdown(result, misses=True)
    assert "- bm25: k2: 3, x1: -" in text  # u1, u2 have no gold: not misses
    assert "Misses at hit@1" not in render_markdown(result)


def test_interval95_wilson_for_shares_of_questions():
    # 26 of 26: Wilson gives [0.871, 1]; a bootstrap of identical values would claim [1, 1].
    low, high = interval95([1.0] * 26, [1.0] * 26)
    assert low == pytest.approx(0.8712, abs=1e-3) and high == 1.0
    assert interval95([0.0] * 10, [1.0] * 10) == [0.0, pytest.approx(0.2775, abs=1e-3)]
    low, high = interval95([1.0, 0.0] * 20, [1.0] * 40)
    assert low == pytest.approx(1 - high) and 0.33 < low < 0.36  # symmetric about 0.5
    # questions without a value (0 / 0) do not count: 3 of 4 counted questions
    assert interval95([1, 1, 1, 0, 0], [1, 1, 1, 1, 0]) == interval95([1, 1, 1, 0], [1, 1, 1, 1])
    assert interval95([0.0, 0.0], [0.0, 0.0]) is None and interval95([], []) is None


def test_interval95_bootstrap_for_graded_values():
    values = [1.0, 0.5, 1 / 3, 1.0, 0.0, 0.25, 1.0, 0.5] * 3
    low, high = interval95(values, [1.0] * len(values))
    assert low < sum(values) / len(values) < high
    assert interval95(values, [1.0] * len(values)) == [low, high]  # seeded: a rerun prints the same
    wide_low, wide_high = interval95(values[:8], [1.0] * 8)
    assert wide_high - wide_low > high - low  # fewer questions, wider interval
    # a ratio of counts (supported citations: 3 of 4, 0 of 1, 2 of 2 ...) resamples questions, not
    # citations
    low, high = interval95([3, 0, 2, 1, 0, 4], [4, 1, 2, 3, 2, 4])
    assert low < 10 / 16 < high


def test_every_reported_metric_is_inside_its_interval():
    rag, questions = _fake()
    result = evaluate(rag, questions, ["bm25"], ci=True)
    info = result.to_dict()["modes"]["bm25"]
    checked = 0
    for section in ("retrieval", "answers"):
        for group, metrics in info[section].items():
            for name, value in metrics.items():
                interval = info["ci95"][section][group][name]
                if value is None:
                    assert interval is None, (section, group, name)
                else:
                    assert interval[0] <= value <= interval[1], (
                        section,
                        group,
                        name,
                        value,
                        interval,
                    )
                    checked += 1
    assert checked > 30
    assert result.modes["bm25"].retrieval["overall"].mrr.interval is not None
    assert "ci95" not in evaluate(rag, questions, ["bm25"]).to_dict()["modes"]["bm25"]
    assert "[0." in render_markdown(result) and "Wilson" in render_markdown(result)


def test_metric_parts_reproduce_the_point_values():
    def row(gold, **fields):
        return QuestionResult(
            id="q", kind="keyword", gold=gold, ranked=(), gold_rank=None, **fields
        )

    rows = [
        row(
            ("a",),
            retrieval={"mrr": 1.0},
            key_fact_recall=0.5,
            citation_precision=None,
            abstained=False,
            supported=(True, False),
        ),
        row((), key_fact_recall=None, citation_precision=1.0, abstained=True, supported=()),
        row(
            ("b",),
            retrieval={"mrr": 0.25},
            key_fact_recall=1.0,
            citation_precision=0.0,
            abstained=True,
            supported=(True,),
        ),
    ]

    def ratio(section, name):
        num, den = metric_parts(rows, section, name)
        return sum(num) / sum(den)

    assert ratio("retrieval", "mrr") == 0.625
    assert (
        ratio("answers", "key_fact_recall") == 0.75
        and ratio("answers", "citation_precision") == 0.5
    )
    assert ratio("answers", "abstained") == pytest.approx(2 / 3)
    assert ratio("answers", "supported_citations") == pytest.approx(2 / 3)
    assert (
        ratio("answers", "abstention_precision") == 0.5
        and ratio("answers", "abstention_recall") == 1.0
    )
    with pytest.raises(ValueError):
        metric_parts(rows, "answers", "speed")


def test_evaluate_k_defaults_to_the_settings_top_k():
    rag, questions = _fake()
    rag.settings.top_k = 3
    report = evaluate(rag, questions, ["bm25"])
    assert report.answer_k == 3 and ("ask", "q1", 3, "bm25") in rag.calls
    assert evaluate(rag, questions, ["bm25"], k=2).answer_k == 2  # an explicit k wins


def test_evaluate_rejects_unknown_mode():
    rag, questions = _fake()
    with pytest.raises(InputError, match="unknown retrieval mode 'fuzzy'"):
        evaluate(rag, questions, ["fuzzy"])


# ---- question files --------------------------------------------------------------------------


def test_load_seed_questions():
    questions = load_questions(REPO / "eval/seed_questions.jsonl")
    assert len(questions) == 170
    assert sum(not q["gold"] for q in questions) == 52


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "a", "question": "q?", "gold": ["x"]', "not valid JSON"),
        ('["a"]', "expected a JSON object, got list"),
        ('{"id": "a", "question": "q?", "gold": ["x"]}', "missing field 'kind'"),
        (
            '{"id": "a", "question": "   ", "gold": ["x"], "kind": "keyword"}',
            "the question is empty",
        ),
        (
            '{"id": "a", "question": "q?", "gold": "x", "kind": "keyword"}',
            "'gold' must be a list of paper ids",
        ),
        (
            '{"id": "a", "question": "q?", "gold": [1], "kind": "keyword"}',
            "'gold' must be a list of paper ids",
        ),
        (
            '{"id": "a", "question": "q?", "gold": ["x", "x"], "kind": "multi"}',
            "'gold' repeats a paper id",
        ),
        (
            '{"id": "a", "question": "q?", "gold": [], "kind": ""}',
            "'kind' must be a non-empty string",
        ),
        ('{"id": "a", "question": "q?", "gold": [], "kind": "overall"}', "reserved"),
        (
            '{"id": "a", "question": "q?", "gold": ["x"], "kind": "numeric", "key_facts": "3%"}',
            "'key_facts' must be",
        ),
        ('{"id": null, "question": "q?", "gold": [], "kind": "unanswerable"}', "'id' must be"),
        (
            '{"id": "k1", "question": "again?", "gold": [], "kind": "unanswerable"}',
            "duplicate id 'k1' (first on line 1)",
        ),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"id": "k1", "question": "What is NAVI?", "gold": ["a"], "kind": "keyword"}\n\n'
        + line
        + "\n"
    )
    with pytest.raises(InputError) as info:
        load_questions(path)
    assert str(info.value).startswith(f"{path}:3: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no questions"):
        load_questions(tmp_path / "empty.jsonl")
    with pytest.raises(InputError, match="no such file"):
        load_questions(tmp_path / "nope.jsonl")


# ---- the real command ------------------------------------------------------------------------


def _all_metrics(node):
    for value in node.values():
        if isinstance(value, dict):
            yield from _all_metrics(value)
        else:
            yield value


@pytest.mark.slow
def test_cli_eval_json_on_seeds(seed_store, tmp_path):
    # Every third question of the seed set (57 of 170, every kind): the whole set took 44 s on a
    # busy machine.
    rows = [
        json.loads(line)
        for line in (REPO / "eval/seed_questions.jsonl").read_text().splitlines()
        if line.strip()
    ][::3]
    questions = write_jsonl(tmp_path / "questions.jsonl", rows)
    proc = run_cli(
        "eval", str(questions), "--mode", "bm25,hybrid", "--json", "--store", str(seed_store)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # every gold id is a seed paper
    data = json.loads(proc.stdout)
    assert data["questions"] == len(rows) == 57 and list(data["modes"]) == ["bm25", "hybrid"]
    unanswerable = sum(r["kind"] == "unanswerable" for r in rows)
    assert (
        data["kinds"]["unanswerable"]["questions"] == unanswerable > 10
        and data["missing_gold"] == {}
    )
    for info in data["modes"].values():
        assert set(info["retrieval"]) == {"keyword", "paraphrase", "numeric", "multi", "overall"}
        for metrics in info["retrieval"].values():
            assert set(metrics) == {"hit@1", "hit@5", "mrr", "recall@5", "recall@10", "ndcg@10"}
        assert set(info["answers"]) == {
            "keyword",
            "paraphrase",
            "numeric",
            "multi",
            "unanswerable",
            "overall",
        }
        assert set(info["answers"]["overall"]) == {
            "key_fact_recall",
            "citation_precision",
            "abstention_precision",
            "abstention_recall",
            "abstained",
            "supported_citations",
        }
        assert info["answerer"] == "extractive" and info["answer_errors"] == 0
        values = list(_all_metrics({"r": info["retrieval"], "a": info["answers"]}))
        assert values and all(v is None or 0.0 <= v <= 1.0 for v in values)
        # Sane, not tuned: the contract's seed setting finds what a keyword question names.
        assert info["retrieval"]["keyword"]["hit@5"] >= 0.9
        assert info["retrieval"]["overall"]["recall@10"] >= 0.8
        assert info["answers"]["overall"]["key_fact_recall"] > 0.2
    assert data["modes"]["hybrid"]["retrieval"]["keyword"]["hit@5"] >= 0.9
    assert data["modes"]["hybrid"]["retrieval"]["overall"]["mrr"] >= 0.8


def test_cli_eval_markdown_table(seed_store, tmp_path):
    rows = [
        json.loads(line)
        for line in (REPO / "eval/seed_questions.jsonl").read_text().splitlines()[:3]
    ]
    rows.append(
        {
            "id": "z1",
            "question": "What is NAVI?",
            "gold": ["wOAslbdI1r", "NOT-A-PAPER"],
            "kind": "custom",
        }
    )
    path = write_jsonl(tmp_path / "few.jsonl", rows)
    proc = run_cli(
        "eval",
        str(path),
        "--mode",
        "dense",
        "--mode",
        "bm25",
        "--no-answers",
        "--store",
        str(seed_store),
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "| kind | metric | dense | bm25 |" in proc.stdout and "|---|---|---:|---:|" in proc.stdout
    )
    assert "| custom (1) | hit@1 |" in proc.stdout  # an unknown kind is grouped under its name
    warning = proc.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("rag: warning:")
    assert "z1: NOT-A-PAPER" in warning[0]


def test_cli_eval_intervals_and_misses(seed_store, tmp_path):
    rows = [
        json.loads(line)
        for line in (REPO / "eval/seed_questions.jsonl").read_text().splitlines()[:6]
    ]
    rows.append(
        {"id": "wrong", "question": "What is NAVI?", "gold": ["qQhTbQSHdG"], "kind": "keyword"}
    )
    path = write_jsonl(tmp_path / "few.jsonl", rows)
    proc = run_cli(
        "eval",
        str(path),
        "--mode",
        "bm25",
        "--no-answers",
        "--ci",
        "--misses",
        "--store",
        str(seed_store),
    )
    assert proc.returncode == 0, proc.stderr
    assert "| hit@1 | " in proc.stdout and " [0." in proc.stdout  # e.g. 0.857 [0.49, 0.97]
    misses = [line for line in proc.stdout.splitlines() if line.startswith("- bm25:")]
    # only NAVI's abstract says "NAVI": FedARC is not ranked
    assert len(misses) == 1 and "wrong: -" in misses[0]
    proc = run_cli(
        "eval",
        str(path),
        "--mode",
        "bm25",
        "--no-answers",
        "--ci",
        "--json",
        "--store",
        str(seed_store),
    )
    data = json.loads(proc.stdout)["modes"]["bm25"]
    assert data["ci95"]["retrieval"]["overall"]["hit@1"][1] <= 1.0
    assert [q["id"] for q in data["questions"]] == [r["id"] for r in rows]


def test_cli_eval_k_defaults_to_top_k(seed_store, tmp_path):
    rows = [
        json.loads(line)
        for line in (REPO / "eval/seed_questions.jsonl").read_text().splitlines()[:2]
    ]
    path = write_jsonl(tmp_path / "two.jsonl", rows)
    env = {"RAG_TOP_K": "3"}
    proc = run_cli(
        "eval", str(path), "--mode", "bm25", "--json", "--store", str(seed_store), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer_k"] == 3
    proc = run_cli(
        "eval", str(path), "--mode", "bm25", "--k", "2", "--store", str(seed_store), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "answers: extractive at k=2." in proc.stdout  # the flag beats RAG_TOP_K
    help_text = " ".join(run_cli("eval", "--help").stdout.split())
    assert "default: the configured top_k, RAG_TOP_K, else 5" in help_text


def test_cli_eval_malformed_line(seed_store, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": "k1", "question": "What is NAVI?", "gold": ["wOAslbdI1r"], "kind": "keyword"}\n'
        '{"id": "k2", "question": "What?", "gold": "wOAslbdI1r", "kind": "keyword"}\n'
    )
    proc = run_cli("eval", str(path), "--store", str(seed_store))
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and f"{path}:2: 'gold' must be a list" in lines[0]
        and "Traceback" not in proc.stderr
    )


def test_cli_eval_bad_mode_is_usage_error(seed_store):
    proc = run_cli(
        "eval",
        str(REPO / "eval/seed_questions.jsonl"),
        "--mode",
        "bm25,fuzzy",
        "--store",
        str(seed_store),
    )
    assert proc.returncode == 2 and "unknown retrieval mode 'fuzzy'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_eval_also_store_adds_a_column_per_store(seed_store, tmp_path):
    """Two real stores in one run (the second a copy of the first, so each figure must agree): a
    column per store and mode, named by the embedding model and, as the two share it, the directory.
    """
    import shutil

    copy = shutil.copytree(seed_store, tmp_path / "copy")
    rows = [
        json.loads(line)
        for line in (REPO / "eval/seed_questions.jsonl").read_text().splitlines()[:8]
    ]
    path = write_jsonl(tmp_path / "few.jsonl", rows)
    proc = run_cli(
        "eval",
        str(path),
        "--mode",
        "bm25,dense",
        "--no-answers",
        "--json",
        "--store",
        str(seed_store),
        "--also-store",
        str(copy),
    )
    assert proc.returncode == 0, proc.stderr
    modes = json.loads(proc.stdout)["modes"]
    model = "minilm-l6-ml-v1"
    assert list(modes) == [
        f"{model} ({seed_store}) bm25",
        f"{model} ({seed_store}) dense",
        f"{model} ({copy}) bm25",
        f"{model} ({copy}) dense",
    ]
    for mode in ("bm25", "dense"):
        assert (
            modes[f"{model} ({seed_store}) {mode}"]["retrieval"]
            == modes[f"{model} ({copy}) {mode}"]["retrieval"]
        )
    for bad, message in (
        (seed_store, "names a store twice"),
        (tmp_path / "nothing", "no store there"),
    ):
        proc = run_cli(
            "eval", str(path), "--no-answers", "--store", str(seed_store), "--also-store", str(bad)
        )
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "nothing").exists()  # nothing was created where no store was


@pytest.mark.parametrize(
    "name", ["seed_questions", "not_covered_questions", "icml2026_unanswerable"]
)
def test_question_files_load_with_valid_subkinds(name):
    questions = load_questions(REPO / "eval" / f"{name}.jsonl")
    unanswerable = [q for q in questions if not q["gold"]]
    assert unanswerable and all(q.get("subkind") in UNANSWERABLE_SUBKINDS for q in unanswerable)


def test_a_subkind_on_an_answerable_question_is_refused(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "x1",
                "question": "What is Palimpsa?",
                "gold": ["wKMV7mXjUr"],
                "kind": "keyword",
                "subkind": "near-miss",
            }
        )
        + "\n"
    )
    with pytest.raises(InputError, match="q.jsonl:1: 'subkind' is for unanswerable questions"):
        load_questions(path)


def test_without_turns_any_rule_off():
    from rag.answer.rules import RULES, active
    from rag.config import Settings
    from rag.errors import InputError
    from rag.evaluation.without import without

    settings = Settings()
    off, names = without(settings, ["topic", "support", "grafted_words", "topic"])
    assert names == ["topic", "support", "grafted_words"]
    assert active(off) == active(settings) - {"topic", "support", "grafted_words"}
    assert settings.rules_off == []  # the settings given are not changed
    for r in RULES:  # every row can be named
        assert r.name not in active(without(settings, [r.name])[0])
    with pytest.raises(InputError, match="--without: no rule 'nope'; the rules: retrieval, topic"):
        without(settings, ["nope"])


def test_rules_off_from_the_environment(monkeypatch):
    from rag.answer.rules import active
    from rag.config import Settings
    from rag.errors import InputError

    monkeypatch.setenv("RAG_RULES_OFF", " boilerplate, quote_repeats ")
    settings = Settings()
    assert settings.rules_off == ["boilerplate", "quote_repeats"]
    assert "boilerplate" not in active(settings) and "support" in active(settings)
    # a rule's own setting turns it off as well
    assert "topic" not in active(Settings(topic_check=False))
    with pytest.raises(InputError, match="RAG_RULES_OFF: no rule 'typo'"):
        active(Settings(rules_off=["typo"]))


def test_cli_eval_without_a_rule(seed_store, tmp_path):
    rows = [
        json.loads(line)
        for line in (REPO / "eval/fresh_topic_questions.jsonl").read_text().splitlines()
        if line.strip()
    ][:6]
    questions = write_jsonl(tmp_path / "questions.jsonl", rows)
    proc = run_cli(
        "eval", str(questions), "--json", "--store", str(seed_store), "--without", "topic"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["without"] == ["topic"] and data["rules_off"] == ["topic"]
    proc = run_cli("eval", str(questions), "--store", str(seed_store), "--without", "suport")
    assert proc.returncode == 1 and "--without: no rule 'suport'; the rules:" in proc.stderr
