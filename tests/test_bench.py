"""The benchmarks as a package: every `bench/` script starts as `python -m bench.GROUP.NAME` from
the repository root (its `--help`, so nothing is measured), none edits `sys.path`, every finished
study says so and what it decided, and the one percentile rule is pinned.

Real processes (the project's python, the real modules); the benchmarks themselves are not run here.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.helpers import percentile

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
GROUPS = ("baseline", "retrieval", "answers", "speed", "serving", "studies", "hardening")

# Run by another venv's python (matplotlib), which this venv does not have; it imports nothing from
# the project.
OTHER_VENV = {"bench.speed.plot_scale"}
# Modules the scripts import (written_queries: adapt_embedder's training questions).
NOT_SCRIPTS = {"bench.helpers", "bench.retrieval.common", "bench.retrieval.written_queries"}
MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts)
    for p in BENCH.rglob("*.py")
    if p.stem != "__init__" and "results" not in p.relative_to(BENCH).parts
)
SCRIPTS = [m for m in MODULES if m not in OTHER_VENV | NOT_SCRIPTS]


def test_percentile_is_the_nearest_rank():
    thirty_three = [float(v) for v in range(33, 0, -1)]  # unsorted on purpose
    # ceil(0.95 * 33) = 32nd, not round(0.95 * 32) + 1 = 31st
    assert percentile(thirty_three, 95) == 32
    assert percentile(thirty_three, 50) == 17
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2  # the lower middle value, not the mean 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4
    assert percentile([7.0], 95) == 7
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="write 95 for p95"):
        percentile([1.0, 2.0], 950)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_runs_as_a_module(name):
    r = subprocess.run(
        [sys.executable, "-m", name, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout


def test_every_bench_module_is_in_a_group():
    """Only the shared helpers sit at the top; every script belongs to one group, each a package."""
    assert [m for m in MODULES if m.count(".") != 2 and m != "bench.helpers"] == []
    assert {m.split(".")[1] for m in MODULES if m.count(".") == 2} == set(GROUPS)
    assert all((BENCH / group / "__init__.py").exists() for group in GROUPS)


def test_no_bench_module_edits_sys_path():
    offenders = [
        str(p.relative_to(REPO))
        for p in sorted(BENCH.rglob("*.py"))
        if "sys.path" in p.read_text("utf-8")
    ]
    assert offenders == []


def test_every_finished_study_says_what_it_decided():
    for path in sorted((BENCH / "studies").glob("[!_]*.py")):
        first = (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").splitlines()[
            0
        ]
        assert first.startswith("Finished study: ") and len(first) > 40, path.name


@pytest.mark.parametrize("name", ["validate_questions", "check_user_questions"])
def test_eval_checkers_run_as_modules(name):
    r = subprocess.run(
        [sys.executable, "-m", f"eval.{name}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_two_store_blend_scores_papers_by_their_best_chunk_in_each_list():
    from bench.studies.retrieval_ensemble import blend

    # Store one: chunks 1-3 (papers A, A, B); store two: its own chunk ids 10-11 (papers B, C).
    first = {
        "dense": [(1, 0.9), (2, 0.5), (3, 0.1)],
        "keyword": [(3, 8.0), (1, 2.0)],
        "rare": set(),
        "paper": {1: "A", 2: "A", 3: "B"},
    }
    second = {
        "dense": [(10, 0.8), (11, 0.2)],
        "keyword": [],
        "rare": set(),
        "paper": {10: "B", 11: "C"},
    }
    assert blend(first, None, 1.0, 0.0) == ["A", "B"]  # dense alone: A's best chunk first
    assert blend(first, None, 0.0, 0.0) == ["B", "A"]  # BM25 alone
    # A: 0.4*1 + 0.2*0 + 0.4*0 = 0.4; B: 0.4*0 + 0.2*1 + 0.4*1 = 0.6; C: 0
    assert blend(first, second, 0.4, 0.4) == ["B", "A", "C"]
    first["rare"] = {1}  # a rare name only A's chunk holds lifts A over any blend
    assert blend(first, second, 0.0, 0.5)[0] == "A"


def test_answer_rules_apply_each_version_of_the_rules_to_the_same_reply(tmp_path):
    """bench.answers.rules: an earlier copy of the rules (taking no abstracts) and today's judge one
    reply each; the reply's own numbering is mapped back to the retrieval order."""
    import rag.answer.rules.answer_type as now
    from bench.answers.rules import holds, load_rules, pieces_of

    before = tmp_path / "answer_type_before.py"
    before.write_text(
        "def asked_type(question):\n    return 'names'\n\n"
        "def gives_asked_type(question, text):\n    return 'CAMP' in text or 'Conflict' in text\n\n"
        "def from_another_paper(question, pieces, keyword_scores):\n    return False\n"
    )
    question = "what base LLM was CAMP fine-tuned from?"
    reply = "- We propose Conflict-Aware Adaptive Margin Preference Alignment (CAMP). [1]"
    assert holds(now, question, reply, [(1, reply)], {1: 3.0}, []) == "answer_type"
    assert holds(load_rules(before), question, reply, [(1, reply)], {1: 3.0}, []) is None
    cites = [{"n": 1, "paper_id": "x"}, {"n": 2, "paper_id": "y"}]
    assert pieces_of("It is fast [2]. It is small [1].", cites, {"x": 3, "y": 1}) == [
        (1, "It is fast [2]."),
        (3, "It is small [1]."),
    ]


def test_answer_names_replays_the_cited_names_rule_on_a_run(seed_rag, seed_store, tmp_path):
    """bench.answers.names, a real process on the seed store: an answered reply citing a paper that
    never writes the name asked about would be held back; one citing the paper that writes it, not;
    list questions and replies already held back are not asked."""
    import json

    question = "How does DeFacto make multimodal reasoning rely on the right visual evidence?"
    hits = seed_rag._retrieve(question)
    writes = next(
        h.paper.paper_id for h in hits if "DeFacto" in f"{h.paper.title} {h.chunk.abstract}"
    )
    other = next(
        h.paper.paper_id for h in hits if "DeFacto" not in f"{h.paper.title} {h.chunk.abstract}"
    )
    answers = [
        {
            "id": "a1",
            "question": question,
            "gold": [writes],
            "outcome": "answered",
            "abstained": False,
            "cited": [other],
        },
        {
            "id": "a2",
            "question": question,
            "gold": [writes],
            "outcome": "answered",
            "abstained": False,
            "cited": [writes],
        },
        {
            "id": "a3",
            "question": question,
            "gold": [],
            "subkind": "near-miss",
            "outcome": "not_stated",
            "abstained": True,
            "cited": [other],
        },
        {
            "id": "a4",
            "question": "which papers build on DeFacto?",
            "gold": [writes],
            "outcome": "answered",
            "abstained": False,
            "cited": [other],
        },
    ]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"answers": answers}))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.answers.names", str(run), "--store", str(seed_store)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "  a1 answerable: DeFacto |" in proc.stdout
        and " a2 " not in proc.stdout
        and " a4 " not in proc.stdout
    )
    assert (
        "answerable 3 of 3 answered, 1 of them held back by the rule; near-miss 0 of 1 answered"
        in proc.stdout
    )
