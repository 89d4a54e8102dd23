#!/usr/bin/env python3
"""Foundation benchmark: this project (`rag`) against the plain LlamaIndex quickstart.

Measured for both, on the 76 seed abstracts (and, with `--data PATH [--limit N]`, on a JSONL
file of {title, abstract} records as well):

  index time        ours: wall time of `rag ingest --rebuild --store DIR` (seeds) or
                    `rag ingest PATH --no-corpus --store DIR` (data); baseline: wall time of the
                    process that runs `VectorStoreIndex.from_documents` into Chroma, plus the
                    time of `from_documents` alone (imports and model load excluded).
  cold ask          a fresh process answering one question without an LLM, median of --runs:
                    ours `rag ask Q --no-llm --store DIR`; baseline loads the persisted index from
                    Chroma, retrieves top 5 and prints the texts. Wall time and peak RSS
                    (`/usr/bin/time -v`; os.wait4 rusage when it is missing).
  warm retrieval    in-process latency after one warm-up pass, ~20 questions x --repeats:
                    ours `RAG(store_dir=DIR).search(q, k=5)`; baseline `retriever.retrieve(q)`
                    with `index.as_retriever(similarity_top_k=5)`.

Both sides run with RAG_*/OPENAI_* variables removed, HF_HUB_OFFLINE=1, and (when `unshare -n`
works, i.e. as root) inside an empty network namespace, so nothing can be downloaded.

Only the standard library: ours runs through the project venv (`--rag-python`, its `rag` script
beside it); the baseline through `bench/baseline/quickstart.py` run by `--baseline-python`.

Example (from the repository root):
  python -m bench.baseline.foundation --markdown bench/results/foundation.md
  python -m bench.baseline.foundation --data ../shared/data/icml2026_main.jsonl.gz --limit 2000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import REPO, apparent_size_mib, busy, percentile, write_json
from tests.harness import TIME_BIN, run_measured  # stdlib only, shared with the tests

PROJECT_DIR = REPO
CORPUS_DIR = PROJECT_DIR / "corpus"
SEED_METADATA = CORPUS_DIR / "seed_metadata.jsonl"
# Run as a file by the baseline venv's python (which has no `bench` package), so it stays a
# standalone script.
HELPER = REPO / "bench" / "baseline" / "quickstart.py"

COLD_QUESTION = "How does Palimpsa relate to Mamba2?"
# The title of the Palimpsa paper (not in the question): the cold output must list it.
COLD_EXPECT = "Learning to Remember, Learn, and Forget"

# ~20 questions about the seed abstracts: keyword-ish, paraphrased and off-topic ones.
QUESTIONS = [
    "How does Palimpsa relate to Mamba2?",
    "Bayesian metaplasticity for in-context learning in gated linear attention",
    "Which paper finds spurious attention heads in CLIP and ablates them?",
    "backdoor attribution in language models",
    "How can we predict whether two fine-tuned models can be merged successfully?",
    "preference optimization for vehicle routing with multiple tasks",
    "Does quantization-aware fine-tuning degrade safety alignment?",
    "Do audio language models actually listen to paralinguistic cues?",
    "cost-aware stopping rules for Bayesian optimization",
    "memory poisoning attacks on LLM agents and defenses",
    "predictive coding on digital hardware",
    "a dataset for attributional style and cognitive reframing",
    "federated learning with heterogeneous data and models",
    "mixture-of-experts pruning and compression",
    "test-time scaling with tree search under a token budget",
    "How do transformers represent hierarchies?",
    "machine unlearning in parameter space",
    "benchmark for goal-oriented software engineering agents",
    "offline imitation learning from good and bad demonstrations",
    "What is the best recipe for sourdough bread?",
]

TARGETS = {
    "cold_ask_s": 3.0,
    "cold_ratio": 1 / 3,
    "peak_rss_mib": 400.0,
    "warm_p50_ms": 20.0,
}


# --------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[foundation] {msg}", file=sys.stderr, flush=True)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("RAG_") or k.startswith("OPENAI_") or k == "TIKTOKEN_CACHE_DIR")
    }
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "ANONYMIZED_TELEMETRY": "False",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


class Runner:
    """Runs commands (optionally in an empty network namespace) and measures wall time and peak
    RSS."""

    def __init__(self, netns: bool, workdir: Path):
        self.workdir = workdir
        self.time_bin = TIME_BIN
        self.netns = netns and self._netns_works()
        if netns and not self.netns:
            log("`unshare -n` does not work here: running without a network namespace")

    @staticmethod
    def _netns_works() -> bool:
        unshare = shutil.which("unshare")
        if not unshare:
            return False
        try:
            return (
                subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30).returncode
                == 0
            )
        except (OSError, subprocess.SubprocessError):
            return False

    def run(self, cmd: list[str], env: dict[str, str], label: str, timeout: float = 7200) -> dict:
        """Run `cmd` (tests/harness.py run_measured), return {wall_s, cpu_s, rss_mib, stdout,
        stderr}; raise on failure (a timeout kills it: a failure too)."""
        full = ["unshare", "-n", *cmd] if self.netns else list(cmd)
        m = run_measured(
            full,
            env=env,
            cwd=self.workdir,
            stdout_path=self.workdir / "last_stdout.txt",
            stderr_path=self.workdir / "last_stderr.txt",
            timeout=timeout,
            time_bin=self.time_bin,
        )
        return m.check(label, cmd).as_dict()


def last_json_line(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in output:\n" + text[-2000:])


def make_workdir(keep: Path | None, prefix: str) -> tuple[Path, str | None]:
    """The bench's working directory: `keep` (created) or a temp dir, returned second for
    removal."""
    if keep:
        workdir = keep.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir, None
    tmp = tempfile.mkdtemp(prefix=prefix)
    return Path(tmp), tmp


# --------------------------------------------------------------------------- inputs


def seed_records() -> list[dict]:
    """The 76 seed abstracts: one per blank-line-separated paragraph after the header line."""
    meta = {}
    if SEED_METADATA.exists():
        for line in SEED_METADATA.read_text(encoding="utf-8").splitlines():
            if line.strip():
                m = json.loads(line)
                meta[(m["seed_file"], int(m["index"]))] = m
    records = []
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        body = path.read_text(encoding="utf-8").split("\n", 1)
        body = body[1] if len(body) > 1 else ""
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]
        for i, para in enumerate(paragraphs, 1):
            m = meta.get((path.name, i), {})
            records.append({"title": m.get("title") or "", "abstract": para})
    return records


def data_records(path: Path, limit: int | None) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            records.append(json.loads(line))
            if limit and len(records) >= limit:
                break
    return records


def write_baseline_docs(records: list[dict], dest: Path) -> int:
    n = 0
    with open(dest, "w", encoding="utf-8") as fh:
        for r in records:
            text = (r.get("abstract") or "").strip() or (r.get("title") or "").strip()
            if not text:
                continue
            fh.write(json.dumps({"text": text, "title": (r.get("title") or "").strip()}) + "\n")
            n += 1
    return n


# --------------------------------------------------------------------------- the two sides

OURS_WARM = r"""
import json, sys, time
from rag import RAG
store, qfile, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
questions = json.load(open(qfile))
r = RAG(store_dir=store)
for q in questions:
    r.search(q, k=5)
times = []
for _ in range(repeats):
    for q in questions:
        t = time.perf_counter()
        r.search(q, k=5)
        times.append(time.perf_counter() - t)
print(json.dumps({"n": len(times), "times_ms": [1000 * t for t in times]}))
"""


class Side:
    """One side of the comparison: how to index, cold-ask and warm-search."""

    def __init__(self, name: str, runner: Runner):
        self.name, self.runner, self.env = name, runner, clean_env()
        self.res: dict = {}
        self.colds: list[dict] = []

    def run(self, cmd, label):
        return self.runner.run(cmd, self.env, f"{self.name} {label}")

    def cold(self, i: int, runs: int, setting: str) -> None:
        c = self.run(self.cold_cmd(), "cold ask")
        self.colds.append(c)
        log(
            f"{self.name}[{setting}]: cold ask {i + 1}/{runs}: {c['wall_s']:.2f} s,"
            f" {c['rss_mib']:.0f} MiB"
        )

    def finish_cold(self) -> None:
        self.res["cold_wall_s"] = statistics.median(c["wall_s"] for c in self.colds)
        self.res["cold_rss_mib"] = statistics.median(c["rss_mib"] for c in self.colds)
        self.res["cold_cpu_s"] = statistics.median(c["cpu_s"] for c in self.colds)
        self.res["cold_runs_s"] = [round(c["wall_s"], 3) for c in self.colds]
        self.res["cold_found"] = COLD_EXPECT.lower() in self.colds[-1]["stdout"].lower()
        self.res["cold_output_head"] = self.colds[-1]["stdout"][:600]

    def warm(self, setting: str) -> None:
        log(f"{self.name}[{setting}]: warm retrieval")
        times = last_json_line(self.run(self.warm_cmd(), "warm")["stdout"])["times_ms"]
        self.res["warm_p50_ms"], self.res["warm_p95_ms"] = (
            percentile(times, 50),
            percentile(times, 95),
        )
        self.res["warm_n"] = len(times)


class Ours(Side):
    def __init__(self, args, runner, store: Path, ingest_path: Path | None, qfile: Path):
        super().__init__("ours", runner)
        self.args, self.store, self.ingest_path, self.qfile = args, store, ingest_path, qfile

    def index(self, setting: str) -> None:
        rag, store = self.args.rag_cli, self.store
        if store.exists():
            shutil.rmtree(store)
        if self.ingest_path is None:
            cmd = [rag, "ingest", "--rebuild", "--store", str(store)]
        else:
            cmd = [rag, "ingest", str(self.ingest_path), "--no-corpus", "--store", str(store)]
        log(f"ours[{setting}]: {' '.join(cmd)}")
        ing = self.run(cmd, "ingest")
        self.res.update(
            index_wall_s=ing["wall_s"],
            index_cpu_s=ing["cpu_s"],
            index_rss_mib=ing["rss_mib"],
            store_mib=apparent_size_mib(store),
        )
        try:
            s = last_json_line(
                self.run([rag, "stats", "--json", "--store", str(store)], "stats")["stdout"]
            )
            self.res["papers"], self.res["chunks"] = s.get("papers"), s.get("chunks")
        except Exception as exc:  # informational only
            log(f"ours[{setting}]: rag stats failed: {exc}")

    def cold_cmd(self):
        return [
            self.args.rag_cli,
            "ask",
            self.args.question,
            "--no-llm",
            "--store",
            str(self.store),
        ]

    def warm_cmd(self):
        return [
            self.args.rag_python,
            "-c",
            OURS_WARM,
            str(self.store),
            str(self.qfile),
            str(self.args.repeats),
        ]


class Baseline(Side):
    def __init__(self, args, runner, store: Path, docs: Path, qfile: Path):
        super().__init__("baseline", runner)
        self.args, self.store, self.docs, self.qfile = args, store, docs, qfile
        self.py = args.baseline_python

    def index(self, setting: str) -> None:
        if self.store.exists():
            shutil.rmtree(self.store)
        log(f"baseline[{setting}]: VectorStoreIndex.from_documents")
        b = self.run(
            [self.py, str(HELPER), "build", "--store", str(self.store), "--docs", str(self.docs)],
            "build",
        )
        info = last_json_line(b["stdout"])
        self.res.update(
            index_wall_s=b["wall_s"],
            index_cpu_s=b["cpu_s"],
            index_rss_mib=b["rss_mib"],
            store_mib=apparent_size_mib(self.store),
            from_documents_s=info["from_documents_s"],
            papers=info["docs"],
            chunks=info["chunks"],
        )

    def cold_cmd(self):
        return [self.py, str(HELPER), "ask", "--store", str(self.store), self.args.question]

    def warm_cmd(self):
        return [
            self.py,
            str(HELPER),
            "warm",
            "--store",
            str(self.store),
            "--questions",
            str(self.qfile),
            "--repeats",
            str(self.args.repeats),
        ]


def bench_setting(args, runner: Runner, setting: str, sides: list[Side]) -> dict:
    """Index with every side, then interleave the cold runs (so load drift hits both), then warm."""
    for side in sides:
        side.index(setting)
    for i in range(args.runs):
        for side in sides if i % 2 == 0 else sides[::-1]:
            side.cold(i, args.runs, setting)
    for side in sides:
        side.finish_cold()
        side.warm(setting)
    return {side.name: side.res for side in sides}


# --------------------------------------------------------------------------- report

ROWS = [
    # key, label, format
    ("papers", "papers indexed", "{:.0f}"),
    ("chunks", "chunks (vectors)", "{:.0f}"),
    ("index_wall_s", "index time, whole process (s)", "{:.2f}"),
    ("from_documents_s", "index time, from_documents only (s)", "{:.2f}"),
    ("index_cpu_s", "index CPU time, user+sys (s)", "{:.2f}"),
    ("index_rss_mib", "index peak RSS (MiB)", "{:.0f}"),
    ("store_mib", "store size on disk (MiB)", "{:.1f}"),
    ("cold_wall_s", "cold ask --no-llm, wall (s, median)", "{:.2f}"),
    ("cold_cpu_s", "cold ask --no-llm, CPU user+sys (s, median)", "{:.2f}"),
    ("cold_rss_mib", "cold ask --no-llm, peak RSS (MiB, median)", "{:.0f}"),
    ("warm_p50_ms", "warm retrieval p50 (ms)", "{:.1f}"),
    ("warm_p95_ms", "warm retrieval p95 (ms)", "{:.1f}"),
]


def fmt(value, spec: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def table_rows(ours: dict | None, base: dict | None) -> list[list[str]]:
    rows = []
    for key, label, spec in ROWS:
        o = (ours or {}).get(key)
        b = (base or {}).get(key)
        if o is None and b is None:
            continue
        ratio = "n/a"
        if isinstance(o, (int, float)) and isinstance(b, (int, float)) and b:
            ratio = f"{o / b:.2f}"
        rows.append([label, fmt(o, spec), fmt(b, spec), ratio])
    o, b = (ours or {}).get("cold_found"), (base or {}).get("cold_found")
    if o is not None or b is not None:
        rows.append(["cold ask output lists the Palimpsa paper", fmt(o, ""), fmt(b, ""), ""])
    return rows


def target_rows(ours: dict | None, base: dict | None) -> list[list[str]]:
    rows = []

    def check(name, value, ok):
        rows.append([name, value, "PASS" if ok else "FAIL"])

    if not ours:
        return [["(ours not run)", "", "n/a"]]
    c = ours["cold_wall_s"]
    check(
        f"cold `rag ask --no-llm` <= {TARGETS['cold_ask_s']:.0f} s",
        f"{c:.2f} s",
        c <= TARGETS["cold_ask_s"],
    )
    if base:
        r = c / base["cold_wall_s"]
        check(
            "cold `rag ask --no-llm` <= 1/3 of baseline",
            f"{r:.2f}x ({c:.2f} / {base['cold_wall_s']:.2f} s)",
            r <= TARGETS["cold_ratio"],
        )
    m = ours["cold_rss_mib"]
    check(
        f"peak RSS (cold ask) <= {TARGETS['peak_rss_mib']:.0f} MB",
        f"{m:.0f} MiB",
        m <= TARGETS["peak_rss_mib"],
    )
    p = ours["warm_p50_ms"]
    check(
        f"warm retrieval p50 <= {TARGETS['warm_p50_ms']:.0f} ms",
        f"{p:.1f} ms",
        p <= TARGETS["warm_p50_ms"],
    )
    return rows


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(r: list) -> str:
        return "  ".join(
            str(x).ljust(w) if i == 0 else str(x).rjust(w)
            for i, (x, w) in enumerate(zip(r, widths))
        )

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def render(results: dict, meta: dict, markdown: bool) -> str:
    parts = []
    table = md_table if markdown else text_table
    if markdown:
        parts.append("# Foundation benchmark: `rag` vs the LlamaIndex quickstart\n")
    parts.append(
        ("" if not markdown else "")
        + "\n".join(f"- {k}: {v}" if markdown else f"{k}: {v}" for k, v in meta.items())
    )
    for setting, res in results.items():
        head = f"## {setting}" if markdown else f"\n== {setting} =="
        parts.append("\n" + head + "\n")
        parts.append(
            table(
                ["metric", "ours", "baseline", "ratio (ours/baseline)"],
                table_rows(res.get("ours"), res.get("baseline")),
            )
        )
        parts.append("\n" + ("### targets" if markdown else "-- targets --") + "\n")
        parts.append(
            table(["target", "ours", "result"], target_rows(res.get("ours"), res.get("baseline")))
        )
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument(
        "--data", type=Path, help="also benchmark on this JSONL(.gz) of {title, abstract} records"
    )
    p.add_argument("--limit", type=int, help="use only the first N records of --data")
    p.add_argument("--no-seeds", action="store_true", help="skip the seed setting (needs --data)")
    p.add_argument(
        "--rag-python",
        default=sys.executable,
        help="python of the venv where the project is installed (default: %(default)s)",
    )
    p.add_argument("--rag-cli", help="the `rag` script (default: beside --rag-python)")
    p.add_argument(
        "--baseline-python",
        default="/work/venvs/baseline/bin/python",
        help="python of the baseline venv (default: %(default)s)",
    )
    p.add_argument("--question", default=COLD_QUESTION, help="the cold-ask question")
    p.add_argument("--runs", type=int, default=3, help="cold-ask runs per side (median reported)")
    p.add_argument("--repeats", type=int, default=5, help="warm passes over the questions")
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--no-netns", action="store_true", help="do not wrap runs in `unshare -n`")
    p.add_argument(
        "--workdir", type=Path, help="keep stores and inputs here (default: a temp dir, removed)"
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the 1-min load average to fall below 1.0",
    )
    p.add_argument("--markdown", type=Path, help="also write the table as markdown to this file")
    p.add_argument("--json", type=Path, help="also write the raw results as JSON to this file")
    args = p.parse_args(argv)
    if args.no_seeds and not args.data:
        p.error("--no-seeds needs --data")
    if args.rag_cli is None:
        args.rag_cli = str(Path(args.rag_python).parent / "rag")
    if not args.skip_ours and not Path(args.rag_cli).exists():
        p.error(
            f"{args.rag_cli} not found (install the project: pip install -e {PROJECT_DIR}) or use"
            " --skip-ours"
        )
    if not args.skip_baseline and not Path(args.baseline_python).exists():
        p.error(
            f"{args.baseline_python} not found: run bench/baseline/setup_venv.sh or --skip-baseline"
        )

    workdir, tmp = make_workdir(args.workdir, "rag-foundation-")
    runner = Runner(netns=not args.no_netns, workdir=workdir)
    qfile = workdir / "questions.json"
    qfile.write_text(json.dumps(QUESTIONS))

    settings: list[tuple[str, list[dict], Path | None]] = []
    if not args.no_seeds:
        settings.append(("seeds (76 abstracts)", seed_records(), None))
    if args.data:
        recs = data_records(args.data.resolve(), args.limit)
        if args.limit:
            ingest_path = workdir / f"{args.data.name.split('.')[0]}.first{len(recs)}.jsonl"
            with open(ingest_path, "w", encoding="utf-8") as fh:
                for r in recs:
                    fh.write(json.dumps(r) + "\n")
        else:
            ingest_path = args.data.resolve()
        settings.append((f"{args.data.name} ({len(recs)} records)", recs, ingest_path))

    if args.wait_idle > 0:
        deadline = time.monotonic() + args.wait_idle
        while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
            time.sleep(5)
    results: dict = {}
    load_before = os.getloadavg()
    try:
        for i, (name, recs, ingest_path) in enumerate(settings):
            docs = workdir / f"baseline_docs_{i}.jsonl"
            write_baseline_docs(recs, docs)
            sides: list[Side] = []
            if not args.skip_ours:
                sides.append(Ours(args, runner, workdir / f"ours_store_{i}", ingest_path, qfile))
            if not args.skip_baseline:
                sides.append(Baseline(args, runner, workdir / f"baseline_store_{i}", docs, qfile))
            res = bench_setting(args, runner, name, sides)
            results[name] = res
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]} (driver)",
        "cold question": args.question,
        "cold runs": f"{args.runs} fresh processes per side, median",
        "warm": f"{len(QUESTIONS)} questions x {args.repeats} repeats after one warm-up pass, k=5",
        "load average (1 min) before / after": f"{load_before[0]:.2f} / {os.getloadavg()[0]:.2f}",
        "network": "empty network namespace (unshare -n)" if runner.netns else "not isolated",
        "peak RSS": "/usr/bin/time -v" if runner.time_bin else "os.wait4 rusage",
        "baseline": "LlamaIndex quickstart: VectorStoreIndex.from_documents + ChromaVectorStore + "
        "HuggingFaceEmbedding(all-MiniLM-L6-v2, torch CPU), as_retriever(similarity_top_k=5)",
    }
    if load_before[0] > (os.cpu_count() or 1) or busy():
        log(
            "WARNING: the machine was busy (load average above the core count): wall times are"
            " inflated; CPU times are the steadier comparison"
        )
    print(render(results, meta, markdown=False))
    if args.markdown:
        args.markdown.write_text(render(results, meta, markdown=True), encoding="utf-8")
        log(f"markdown written to {args.markdown}")
    if args.json:
        write_json(args.json, {"meta": meta, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
