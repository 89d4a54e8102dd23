#!/usr/bin/env python3
"""Scale benchmark: `rag` against the plain LlamaIndex quickstart from 76 to ~100k abstracts.

Corpora (`--sizes`, default `76,6k,20k,100k`), built from ../shared/data/ (or `--data PATH`,
repeatable):

  76      the seeds only: the project's corpus/ (76 abstracts)
  6k      seeds + all of the first source (icml2026_main: 5,862 records, 5,871 papers after dedup)
  20k     seeds + the first 20,000 data records, taken in order from icml2026_main,
          icml2026_workshops, neurips_2023_2025, paperlists_1987_2025
  100k    the same, 100,000 data records
  N, Nk   any other whole number (or thousands): seeds + the first N data records (for tests:
          `--sizes 76,300`); `seeds` and `0` are aliases of `76`

The data records of each size are written once to the workdir as JSONL, one file per source (each
source keeps its own fields and so the project's id rules), and both sides get the same records:
ours `rag ingest FILE... --store DIR` (corpus/ + the files; `rag ingest --store DIR` for 76), the
baseline `VectorStoreIndex.from_documents` over the seed documents (as bench/baseline/foundation.py
builds them) and one document "title\\nabstract" per data record that has an abstract
(bench/baseline/quickstart.py).

Per size and side:
  ingest wall        whole-process wall time of the ingest command (imports and model load included)
  throughput         abstracts fed (seeds + data records with a non-empty abstract) / ingest wall
  ingest peak RSS    of the ingest process tree (/usr/bin/time -v)
  store size         du -sk of the store directory (server variant: + the server's data directory)
  warm p50/p95       in-process retrieval latency, one warm-up pass then ~40 questions x --repeats:
                     ours `RAG(store_dir=DIR).search(q, k=5)` (hybrid, the default mode); baseline
                     `index.as_retriever(similarity_top_k=5).retrieve(q)`
  cold ask           a fresh `rag ask Q --no-llm --store DIR` (baseline: load the index, retrieve
                     top 5, print): wall time and peak RSS, median of --runs
Sides: ours with embedded Chroma, ours against a Chroma server (`chroma run`, RAG_CHROMA_URL; on by
default, `--no-server` to skip; server peak RSS from /proc/PID/status VmHWM), and the baseline.
`--kill-resume` also SIGKILLs an ingest into a fresh store at the largest size about half-way
through, re-runs it to completion and checks the result against the clean run (papers, chunks, no
orphan or missing vectors).

Results are saved to the JSON after every measurement; `--resume-json FILE` skips what FILE already
holds (the full run takes hours). The exit status is 1 when a measurement failed (what was measured
is still written), 130 when interrupted.

Stdlib only: ours runs through the project venv (`--rag-python`, `rag` and `chroma` beside it), the
baseline through bench/baseline/quickstart.py run by `--baseline-python`; the PNG is drawn by
bench/speed/plot_scale.py run by `--plot-python` (needs matplotlib).

Example (from the repository root; the full run, hours): python -m bench.speed.scale --markdown
bench/results/scale.md --json bench/results/scale.json --plot docs/scale.png A quick check: python
-m bench.speed.scale --sizes 76,300 --runs 1 --repeats 1 --kill-resume --markdown /tmp/scale.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Runner, clean_env, seed records, baseline docs, tables
from bench.baseline import foundation as fd
from bench.helpers import REPO, SHARED_DATA, apparent_size_mib, disk_usage_mib, percentile

# stdlib only, shared
from tests.harness import ChromaServer, kill_group, run_measured, start_chroma_server

PROJECT_DIR = REPO
# Run as a file by --plot-python (a venv with matplotlib and no `bench` package): a standalone
# script.
PLOTTER = REPO / "bench" / "speed" / "plot_scale.py"
DEFAULT_SOURCES = [
    SHARED_DATA / n
    for n in (
        "icml2026_main.jsonl.gz",
        "icml2026_workshops.jsonl.gz",
        "neurips_2023_2025.jsonl.gz",
        "paperlists_1987_2025.jsonl.gz",
    )
]
DEFAULT_SIZES = "76,6k,20k,100k"
SIDES = ("ours", "server", "baseline")
SIDE_NAMES = {"ours": "ours (embedded)", "server": "ours (Chroma server)", "baseline": "baseline"}
# The field names the project reads an abstract from (rag/index/corpus.py
# FIELD_ALIASES["abstract"]).
ABSTRACT_FIELDS = ("abstract", "summary", "paper_abstract", "text", "tldr_abstract")

# The seed questions of bench.baseline.foundation plus 20 broad ones that many papers of a big
# corpus match.
QUESTIONS = fd.QUESTIONS + [
    "diffusion models for high-resolution image generation",
    "Why do graph neural networks oversmooth and how can it be prevented?",
    "contrastive self-supervised representation learning",
    "parameter-efficient fine-tuning with low-rank adapters",
    "reward models for reinforcement learning from human feedback",
    "certified robustness against adversarial examples",
    "speculative decoding to speed up LLM inference",
    "causal discovery from observational data",
    "differentially private stochastic gradient descent",
    "vision transformers for dense prediction",
    "few-shot classification with meta-learning",
    "scalable Gaussian process inference",
    "knowledge distillation from a large teacher model",
    "sparse attention for long-context language models",
    "cooperative multi-agent reinforcement learning",
    "out-of-distribution detection for neural networks",
    "protein structure prediction with deep learning",
    "What is the convergence rate of Adam on nonconvex problems?",
    "chain-of-thought prompting and reasoning in large language models",
    "neural network pruning at initialization",
]

GB = 1e9 / 2**20  # 1 GB, in MiB
# Issue 18's targets (the earlier ones, all met, were looser: 25 min and 2 GB at 100k, p50 < 50 ms,
# p95 < 150 ms, cold < 3 s).
TARGETS = {
    "throughput_ratio": 2.5,  # ours / baseline, at every size
    "ingest_100k_s": 20 * 60,  # at >= 100k data records
    "ingest_100k_rss_mib": 1.2 * GB,
    # at 100k (hybrid), and below the baseline's dense-only p50 at every size
    "warm_p50_ms": 10.0,
    "warm_p50_6k_ms": 5.0,  # at 6k
    "warm_p95_ms": 15.0,  # at 100k
    "cold_100k_s": 1.3,  # cold `rag ask --no-llm` at 100k, embedded
    "update_s": 15.0,  # adding UPDATE_PAPERS papers to the store, whole `rag ingest`
}
BIG = 100_000  # data records from which the 100k targets apply
# data records for which the 6k target (p50 <= 5 ms) applies: the ICML main track
SIX_K = (5_000, 10_000)
UPDATE_PAPERS = 100  # new papers added to each size's store after its measurements

OURS_WARM = fd.OURS_WARM  # RAG(store_dir=...).search(q, k=5) after one warm-up pass

VECTOR_CHECK = r"""
import json, sqlite3, sys
from pathlib import Path
from rag import RAG
store = Path(sys.argv[1])
r = RAG(store_dir=store)
col = r.store.collection()
ids, offset = set(), 0
while True:
    got = col.get(include=[], limit=5000, offset=offset)
    if not got["ids"]:
        break
    ids.update(got["ids"])
    offset += len(got["ids"])
db = sqlite3.connect(f"file:{store / 'papers.sqlite'}?mode=ro", uri=True)
chunk_ids = {row[0] for row in db.execute("SELECT chunk_id FROM chunks")}
papers = db.execute("SELECT COUNT(DISTINCT paper_id) FROM chunks").fetchone()[0]
print(json.dumps({"vectors": col.count(), "vector_ids": len(ids), "chunks": len(chunk_ids),
                  "papers": papers, "orphan_vectors": len(ids - chunk_ids),
                  "missing_vectors": len(chunk_ids - ids)}))
"""

# After an update: the persisted keyword index against one built from all the store's chunks at
# once.
KEYWORD_CHECK = r"""
import json, sys
from rag import RAG
from rag.index.keyword import KeywordIndex
r = RAG(store_dir=sys.argv[1], llm="none")
questions = json.load(open(sys.argv[2]))
stale = r.store.keyword_index_stale()
persisted = r.store.keyword_index()
full = KeywordIndex.build(r.store._db().execute("SELECT rowid, text FROM chunks ORDER BY rowid"))
print(json.dumps({"stale": stale, "segments": len(persisted.segments),
                  "same_keys": persisted.keys.tolist() == full.keys.tolist(),
                  "same_results": all(persisted.search(q, 50) == full.search(q, 50)
                                      for q in questions)}))
"""

_T0 = time.monotonic()


def log(msg: str) -> None:
    el = time.monotonic() - _T0
    print(
        f"[scale {time.strftime('%H:%M:%S')} +{el / 60:5.1f}m] {msg}", file=sys.stderr, flush=True
    )


def dur(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


# --------------------------------------------------------------------------- sizes and inputs


@dataclass
class Size:
    name: str
    kind: str  # "seeds" | "first_file" | "count"
    n: int = 0


def parse_size(text: str) -> Size:
    t = text.strip().lower()
    if t in ("76", "seeds", "0"):
        return Size(t, "seeds")
    if t == "6k":
        return Size(t, "first_file")
    m = re.fullmatch(r"(\d+)(k?)", t)
    if not m:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}: use 76, 6k, 20k, 100k or a number N / Nk"
        )
    return Size(t, "count", int(m.group(1)) * (1000 if m.group(2) else 1))


def parse_sizes(text: str) -> list[Size]:
    if text.strip().lower() in ("", "none"):
        return []
    sizes = [parse_size(x) for x in text.split(",") if x.strip()]
    names = [s.name for s in sizes]
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a size is repeated in {text!r}")
    return sizes


def _open_text(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.name.endswith(".gz")
        else open(path, encoding="utf-8")
    )


def _abstract(rec: dict) -> str:
    for name in ABSTRACT_FIELDS:
        value = rec.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def expected_records(size: Size, sources: list[Path]) -> int:
    """Data records a size will hold (to find the largest one before building it)."""
    if size.kind == "seeds":
        return 0
    if size.kind == "count":
        return size.n
    with _open_text(sources[0]) as fh:
        return sum(1 for line in fh if line.strip())


def prepare_inputs(size: Size, sources: list[Path], seeds: list[dict], workdir: Path) -> dict:
    """Write the data records of `size` (one JSONL per source) and the baseline documents."""
    d = workdir / "inputs" / slug(size.name)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    docs = d / "baseline_docs.jsonl"
    seed_docs = fd.write_baseline_docs(seeds, docs)
    files: list[str] = []
    per_source: dict[str, int] = {}
    data_records = with_abstract = 0
    if size.kind != "seeds":
        limit = None if size.kind == "first_file" else size.n
        with open(docs, "a", encoding="utf-8") as out_docs:
            for i, src in enumerate(sources[:1] if size.kind == "first_file" else sources):
                if limit is not None and data_records >= limit:
                    break
                dest = d / f"{i:02d}_{src.name.split('.')[0]}.jsonl"
                n_here = 0
                with _open_text(src) as fh, open(dest, "w", encoding="utf-8") as out:
                    for line in fh:
                        if not line.strip():
                            continue
                        if limit is not None and data_records >= limit:
                            break
                        rec = json.loads(line)
                        # the record as it is
                        out.write(line if line.endswith("\n") else line + "\n")
                        data_records += 1
                        n_here += 1
                        abstract = _abstract(rec) if isinstance(rec, dict) else ""
                        if abstract:
                            with_abstract += 1
                            title = rec.get("title") if isinstance(rec.get("title"), str) else ""
                            title = " ".join(title.split())
                            out_docs.write(
                                json.dumps(
                                    {
                                        "text": f"{title}\n{abstract}" if title else abstract,
                                        "title": title,
                                        "paper_id": str(rec.get("id") or ""),
                                    }
                                )
                                + "\n"
                            )
                files.append(str(dest))
                per_source[src.name] = n_here
        if limit is not None and data_records < limit:
            log(
                f"size {size.name}: only {data_records} data records in the sources (asked for"
                f" {limit})"
            )
    update = d / "update.jsonl"
    write_update_records(size, sources, data_records, update)
    return {
        "update": str(update),
        "kind": size.kind,
        "data_records": data_records,
        "data_with_abstract": with_abstract,
        "seeds": seed_docs,
        "abstracts_fed": seed_docs + with_abstract,
        "sources": per_source,
        "files": files,
        "baseline_docs": str(docs),
    }


def write_update_records(size: Size, sources: list[Path], data_records: int, dest: Path) -> None:
    """The UPDATE_PAPERS data records with an abstract that follow the size's own, in source
    order."""
    skip_files = 1 if size.kind == "first_file" else 0
    skip = 0 if size.kind == "first_file" else data_records
    written = 0
    with open(dest, "w", encoding="utf-8") as out:
        for src in sources[skip_files:]:
            with _open_text(src) as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    if skip:
                        skip -= 1
                        continue
                    rec = json.loads(line)
                    if isinstance(rec, dict) and _abstract(rec):
                        out.write(line if line.endswith("\n") else line + "\n")
                        written += 1
                        if written == UPDATE_PAPERS:
                            return


# --------------------------------------------------------------------------- running commands


class ScaleRunner(fd.Runner):
    """foundation.Runner plus: a shared network namespace (nsenter into the Chroma server's),
    a watchdog that kills the whole process group on timeout, progress lines for long runs, and
    per-command logs under WORKDIR/logs."""

    def __init__(self, netns: bool, workdir: Path, heartbeat: float, ns_pid: int | None = None):
        super().__init__(netns=netns and ns_pid is None, workdir=workdir)
        self.ns_pid = ns_pid
        self.heartbeat = heartbeat
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)

    def prefix(self) -> list[str]:
        if self.ns_pid:
            return ["nsenter", "-t", str(self.ns_pid), "-n"]
        return ["unshare", "-n"] if self.netns else []

    def run(
        self,
        cmd: list[str],
        env: dict[str, str],
        label: str,
        timeout: float = 6 * 3600,
        progress=None,
    ) -> dict:
        def beat(elapsed: float) -> None:
            extra = ""
            if progress:
                try:
                    extra = progress() or ""
                except Exception:  # progress is informational
                    pass
            log(f"{label}: still running after {dur(elapsed)}{extra}")

        m = run_measured(
            [*self.prefix(), *cmd],
            env=env,
            cwd=self.workdir,
            stdout_path=self.logdir / f"{slug(label)}.out",
            stderr_path=self.logdir / f"{slug(label)}.err",
            timeout=timeout,
            time_bin=self.time_bin,
            new_session=True,
            heartbeat=self.heartbeat,
            on_heartbeat=beat,
        )
        if m.timed_out:
            raise RuntimeError(f"{label} timed out after {dur(timeout)}: {' '.join(cmd)}")
        return m.check(label, cmd).as_dict()


def manifest_counts(store: Path) -> tuple[int, int] | None:
    """(papers, chunks) committed in the store's manifest, read-only (safe while an ingest
    writes)."""
    db_path = store / "papers.sqlite"
    if not db_path.exists():
        return None
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT COUNT(DISTINCT paper_id), COUNT(*) FROM chunks").fetchone()
    finally:
        con.close()


def _committed(store: Path) -> str:
    counts = manifest_counts(store)
    return f", {counts[0]:,} papers / {counts[1]:,} chunks committed" if counts else ""


SUMMARY_RES = {
    "new_papers": r"indexed (\d+) new papers?",
    "new_chunks": r"new papers? \((\d+) chunks?\)",
    "records_read": r"(\d+) records? read from",
    "files_read": r"read from (\d+) files?",
    "duplicates": r"(\d+) duplicates? within the input",
    "already_indexed": r"(\d+) already indexed",
    "skipped_no_abstract": r"(\d+) skipped without an abstract",
}


def parse_summary(text: str) -> dict:
    """The `rag ingest` summary line (rag/index/ingest.py IngestReport.summary), printed on
    stdout."""
    lines = [ln for ln in text.strip().splitlines() if " read from " in ln]
    if not lines:
        return {}
    line = lines[-1].strip()
    out: dict = {"line": line}
    for key, pattern in SUMMARY_RES.items():
        m = re.search(pattern, line)
        out[key] = int(m.group(1)) if m else 0
    return out


# --------------------------------------------------------------------------- the three sides


class Side:
    key = ""

    def __init__(self, bench: Bench, size: Size, inputs: dict):
        self.bench, self.args, self.size, self.inputs = bench, bench.args, size, inputs
        self.runner: ScaleRunner = bench.runner
        self.env = fd.clean_env()
        self.store = bench.workdir / f"{self.key}_store_{slug(size.name)}"
        self.marker = self.store.with_name(self.store.name + ".ingested.json")

    @property
    def label(self) -> str:
        return f"{self.key}[{self.size.name}]"

    def run(self, cmd, what, **kw):
        return self.runner.run(cmd, self.env, f"{self.label} {what}", **kw)

    def ready(self) -> bool:
        """The store of a previous (resumed) run is still here and complete."""
        return self.marker.exists() and self.store.exists()

    def clear(self) -> None:
        self.marker.unlink(missing_ok=True)
        if self.store.exists():
            shutil.rmtree(self.store)

    def start(self, fresh: bool) -> None:
        pass

    def stop(self) -> None:
        pass

    def ingest(self, res: dict) -> None:
        self.clear()
        self.start(fresh=True)
        load = os.getloadavg()[0]
        log(f"{self.label}: ingest {self.inputs['abstracts_fed']:,} abstracts (load {load:.2f})")
        r = self.run(self.ingest_cmd(), "ingest", timeout=self.args.timeout, progress=self.progress)
        res.update(
            ingest_wall_s=r["wall_s"],
            ingest_cpu_s=r["cpu_s"],
            ingest_rss_mib=r["rss_mib"],
            throughput=self.inputs["abstracts_fed"] / r["wall_s"],
            load_before_ingest=load,
        )
        self.after_ingest(res, r)
        res["store_mib"] = disk_usage_mib(self.store) + res.get("server_data_mib", 0.0)
        res["store_apparent_mib"] = apparent_size_mib(self.store)
        self.marker.write_text(
            json.dumps(
                {
                    k: v
                    for k, v in res.items()
                    if not k.startswith("cold") and not k.startswith("warm")
                }
            )
        )
        log(
            f"{self.label}: ingest {dur(r['wall_s'])}, {res['throughput']:.1f} abstracts/s, "
            f"peak RSS {r['rss_mib']:.0f} MiB, store {res['store_mib']:.1f} MiB"
            + (
                f", {res['papers']:,} papers / {res['chunks']:,} chunks"
                if res.get("papers") is not None
                else ""
            )
        )

    def progress(self):
        return ""

    def after_ingest(self, res: dict, r: dict) -> None:
        pass

    def cold(self) -> dict:
        return self.run(self.cold_cmd(), "cold ask")

    def warm(self, res: dict) -> None:
        res["load_before_warm"] = round(os.getloadavg()[0], 2)
        log(
            f"{self.label}: warm retrieval ({len(QUESTIONS)} questions x {self.args.repeats}, "
            f"load {res['load_before_warm']:.2f})"
        )
        times = fd.last_json_line(self.run(self.warm_cmd(), "warm")["stdout"])["times_ms"]
        res.update(
            warm_p50_ms=percentile(times, 50),
            warm_p95_ms=percentile(times, 95),
            warm_mean_ms=statistics.fmean(times),
            warm_n=len(times),
        )
        log(f"{self.label}: warm p50 {res['warm_p50_ms']:.1f} ms, p95 {res['warm_p95_ms']:.1f} ms")


class Ours(Side):
    key = "ours"

    def __init__(self, bench, size, inputs):
        super().__init__(bench, size, inputs)
        self.env = fd.clean_env(bench.args.rag_env)

    def ingest_cmd(self, store: Path | None = None) -> list[str]:
        # --with-corpus: a store of one's own holds only what is ingested; the baseline gets the
        # seeds too.
        return [
            self.args.rag_cli,
            "ingest",
            *self.inputs["files"],
            *(["--with-corpus"] if self.inputs["files"] else []),
            "--store",
            str(store or self.store),
        ]

    def progress(self):
        return _committed(self.store)

    def stats(self, store: Path | None = None) -> dict:
        s = fd.last_json_line(
            self.run(
                [self.args.rag_cli, "stats", "--json", "--store", str(store or self.store)], "stats"
            )["stdout"]
        )
        return {"papers": s.get("papers"), "chunks": s.get("chunks")}

    def after_ingest(self, res: dict, r: dict) -> None:
        res["ingest_summary"] = parse_summary(r["stdout"] + "\n" + r["stderr"])
        res.update(self.stats())

    def cold_cmd(self):
        return [
            self.args.rag_cli,
            "ask",
            self.args.question,
            "--no-llm",
            "--store",
            str(self.store),
        ]

    def update(self, res: dict) -> None:
        """Add UPDATE_PAPERS new papers to the store (the last step at a size: it changes the
        store), then compare its keyword index with a full rebuild's."""
        before = self.stats()
        r = self.run(
            [self.args.rag_cli, "ingest", self.inputs["update"], "--store", str(self.store)],
            "update",
        )
        after = self.stats()
        check = fd.last_json_line(
            self.run(
                [self.args.rag_python, "-c", KEYWORD_CHECK, str(self.store), str(self.bench.qfile)],
                "keyword check",
            )["stdout"]
        )
        res.update(
            update_wall_s=r["wall_s"],
            update_rss_mib=r["rss_mib"],
            update_cpu_s=r["cpu_s"],
            update_papers=(after["papers"] or 0) - (before["papers"] or 0),
            update_keyword_equal=check["same_keys"]
            and check["same_results"]
            and not check["stale"],
            update_keyword_check=check,
        )
        log(
            f"{self.label}: {res['update_papers']} papers added in {r['wall_s']:.1f} s; keyword"
            f" index equal to a full rebuild: {res['update_keyword_equal']}"
        )

    def warm_cmd(self):
        return [
            self.args.rag_python,
            "-c",
            OURS_WARM,
            str(self.store),
            str(self.bench.qfile),
            str(self.args.repeats),
        ]


class Server(Ours):
    key = "server"

    def __init__(self, bench, size, inputs):
        super().__init__(bench, size, inputs)
        self.server_dir = bench.workdir / f"chroma_server_{slug(size.name)}"
        self.server: ChromaServer | None = None  # tests/harness.py's

    def ready(self) -> bool:
        return super().ready() and self.server_dir.exists()

    def clear(self) -> None:
        super().clear()
        self.stop()
        if self.server_dir.exists():
            shutil.rmtree(self.server_dir)

    def start(self, fresh: bool) -> None:
        if self.server is not None:
            return
        if fresh and self.server_dir.exists():
            shutil.rmtree(self.server_dir)
        self.server_dir.mkdir(parents=True, exist_ok=True)
        # `chroma run` on loopback; inside its own empty network namespace when `unshare -n` works
        # (clients join it with `nsenter -n`), so the server variant is as offline as the rest.
        server_log = self.bench.workdir / "logs" / f"chroma_server_{self.server_dir.name}.log"
        self.server = start_chroma_server(
            self.server_dir,
            exe=self.args.chroma_cli,
            log_path=server_log,
            env=fd.clean_env(),
            netns=self.bench.server_netns,
            probe_python=self.args.rag_python,
            timeout=120,
        )
        log(
            f"chroma server up on {self.server.url} (pid {self.server.proc.pid}, data"
            f" {self.server_dir})"
        )
        self.fresh = fresh
        self.env = fd.clean_env({**self.args.rag_env, "RAG_CHROMA_URL": self.server.url})
        self.runner = ScaleRunner(
            netns=False,
            workdir=self.bench.workdir,
            heartbeat=self.args.heartbeat,
            ns_pid=self.server.proc.pid if self.bench.server_netns else None,
        )
        self.cpu0 = self.server.status().get("cpu_s", 0.0)

    def stop(self) -> dict:
        st = {}
        if self.server is not None:
            st = self.server.status()  # before it stops: peak RSS (VmHWM) and CPU
            self.server.stop(timeout=30)
            log(f"chroma server stopped (peak RSS {st.get('VmHWM', float('nan')):.0f} MiB)")
            self.server = None
        return st

    def after_ingest(self, res: dict, r: dict) -> None:
        st = self.server.status()
        res["server_rss_mib"] = st.get("VmHWM")
        res["server_cpu_s"] = st.get("cpu_s", 0.0) - self.cpu0
        super().after_ingest(res, r)
        res["server_data_mib"] = disk_usage_mib(self.server_dir)


class Baseline(Side):
    key = "baseline"

    def __init__(self, bench, size, inputs):
        super().__init__(bench, size, inputs)
        self.py = self.args.baseline_python

    def ingest_cmd(self):
        return [
            self.py,
            str(fd.HELPER),
            "build",
            "--store",
            str(self.store),
            "--docs",
            self.inputs["baseline_docs"],
        ]

    def after_ingest(self, res: dict, r: dict) -> None:
        info = fd.last_json_line(r["stdout"])
        res.update(
            papers=info["docs"], chunks=info["chunks"], from_documents_s=info["from_documents_s"]
        )

    def cold_cmd(self):
        return [self.py, str(fd.HELPER), "ask", "--store", str(self.store), self.args.question]

    def warm_cmd(self):
        return [
            self.py,
            str(fd.HELPER),
            "warm",
            "--store",
            str(self.store),
            "--questions",
            str(self.bench.qfile),
            "--repeats",
            str(self.args.repeats),
        ]


# --------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args, workdir: Path, results: dict, out_json: Path):
        self.args, self.workdir, self.results, self.out_json = args, workdir, results, out_json
        self.runner = ScaleRunner(
            netns=not args.no_netns, workdir=workdir, heartbeat=args.heartbeat
        )
        # The server variant shares one namespace: `unshare -n` + `ip link set lo up`, clients
        # `nsenter -n`.
        self.server_netns = (
            self.runner.netns and bool(shutil.which("ip")) and bool(shutil.which("nsenter"))
        )
        if args.server and self.runner.netns and not self.server_netns:
            log(
                "`ip` or `nsenter` not found: the Chroma server variant runs on the host's loopback"
            )
        self.qfile = workdir / "questions.json"
        self.qfile.write_text(json.dumps(QUESTIONS))
        self.failed = False
        self.rng = random.Random(args.seed)

    def save(self) -> None:
        self.results["meta"]["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
        tmp = self.out_json.with_name(self.out_json.name + ".tmp")
        self.out_json.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(self.results, indent=2), encoding="utf-8")
        os.replace(tmp, self.out_json)

    def step(self, side: Side | None, res: dict, what: str, fn) -> bool:
        """Run one measurement; on failure record the error (the run goes on) and return False."""
        try:
            fn()
            res.get("errors", {}).pop(what, None)
            if not res.get("errors"):
                res.pop("errors", None)
            return True
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001  (recorded, reported, exit status 1)
            self.failed = True
            where = side.label if side else "run"
            log(f"{where}: {what} FAILED: {exc}")
            res.setdefault("errors", {})[what] = str(exc)[-3000:]
            return False
        finally:
            self.save()

    def wait_idle(self) -> None:
        if self.args.wait_idle <= 0 or os.getloadavg()[0] < 1.0:
            return
        log(
            f"waiting up to {dur(self.args.wait_idle)} for the load average"
            f" ({os.getloadavg()[0]:.2f}) to fall below 1"
        )
        deadline = time.monotonic() + self.args.wait_idle
        while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
            time.sleep(5)
        log(f"load average now {os.getloadavg()[0]:.2f}")

    def bench_size(
        self, size: Size, with_baseline: bool, with_server: bool, kill_resume: bool
    ) -> None:
        self.wait_idle()
        inputs = prepare_inputs(size, self.args.sources, self.seeds, self.workdir)
        entry = self.results["sizes"].get(size.name)
        sig = {k: inputs[k] for k in ("kind", "data_records", "abstracts_fed", "sources")}
        if entry and any(entry.get(k) != v for k, v in sig.items()):
            log(
                f"size {size.name}: the saved results were measured on other inputs: measuring"
                " again"
            )
            entry = None
        if entry is None:
            entry = {}
        entry.update(sig, data_with_abstract=inputs["data_with_abstract"], seeds=inputs["seeds"])
        self.results["sizes"][size.name] = entry
        self.save()
        per_source = ", ".join(f"{k}: {v:,}" for k, v in inputs["sources"].items()) or "seeds only"
        log(
            f"== size {size.name}: {inputs['data_records']:,} data records + {inputs['seeds']}"
            f" seeds = {inputs['abstracts_fed']:,} abstracts fed ({per_source})"
        )

        sides: list[Side] = [Ours(self, size, inputs)]
        if with_server:
            sides.append(Server(self, size, inputs))
        elif self.args.server_sizes and "ingest_wall_s" not in entry.setdefault("server", {}):
            entry["server"] = {"not_run": True}
        if with_baseline:
            sides.append(Baseline(self, size, inputs))
        elif "ingest_wall_s" not in entry.setdefault("baseline", {}):
            entry["baseline"] = {"not_run": True}
        try:
            self._measure(entry, sides)
        finally:
            for s in sides:
                s.stop()
        if kill_resume:
            self.kill_resume(entry, sides[0])

    def _measure(self, entry: dict, sides: list[Side]) -> None:
        live: list[Side] = []
        for side in sides:
            res = entry.setdefault(side.key, {})
            res.pop("not_run", None)
            complete = all(k in res for k in ("ingest_wall_s", "cold_wall_s", "warm_p50_ms"))
            if complete:
                log(f"{side.label}: already measured (resume): skipped")
                continue
            res.pop("errors", None)  # the missing steps are tried again
            if "ingest_wall_s" in res and side.ready():
                log(f"{side.label}: ingest already measured, store kept: reusing it")
                try:
                    side.start(fresh=False)
                except Exception as exc:  # noqa: BLE001
                    log(f"{side.label}: could not restart the server ({exc}): ingesting again")
                else:
                    live.append(side)
                    continue
            res.clear()  # a new ingest: old cold/warm figures belonged to another store
            if self.step(side, res, "ingest", lambda s=side, r=res: s.ingest(r)):
                live.append(side)
            else:
                side.stop()

        cold_sides = [s for s in live if "cold_wall_s" not in entry[s.key]]
        runs: dict[str, list[dict]] = {s.key: [] for s in cold_sides}
        cold_load = round(os.getloadavg()[0], 2)
        if cold_sides:
            log(
                f"cold `ask --no-llm`: {self.args.runs} run(s) x"
                f" {', '.join(s.label for s in cold_sides)}"
            )
        for i in range(self.args.runs):
            for side in cold_sides if i % 2 == 0 else cold_sides[::-1]:
                res = entry[side.key]
                if res.get("errors", {}).get("cold"):
                    continue

                def one(s=side):
                    c = s.cold()
                    runs[s.key].append(c)
                    log(
                        f"{s.label}: cold ask {len(runs[s.key])}/{self.args.runs}:"
                        f" {c['wall_s']:.2f} s, {c['rss_mib']:.0f} MiB"
                    )

                self.step(side, res, "cold", one)
        for side in cold_sides:
            res, cs = entry[side.key], runs[side.key]
            if len(cs) == self.args.runs:
                res.update(
                    cold_wall_s=statistics.median(c["wall_s"] for c in cs),
                    cold_rss_mib=statistics.median(c["rss_mib"] for c in cs),
                    cold_cpu_s=statistics.median(c["cpu_s"] for c in cs),
                    cold_runs_s=[round(c["wall_s"], 3) for c in cs],
                    cold_found=fd.COLD_EXPECT.lower() in cs[-1]["stdout"].lower(),
                    load_before_cold=cold_load,
                    cold_output_head=cs[-1]["stdout"][:400],
                )
        self.save()
        for side in live:
            res = entry[side.key]
            if "warm_p50_ms" not in res:
                self.step(side, res, "warm", lambda s=side, r=res: s.warm(r))
            if isinstance(side, Ours) and "update_wall_s" not in res and "warm_p50_ms" in res:
                self.step(side, res, "update", lambda s=side, r=res: s.update(r))
            if isinstance(side, Server) and side.server is not None:
                fresh = side.fresh
                st = side.stop()
                if fresh and st.get("VmHWM") is not None:  # a restarted server's peak says nothing
                    res["server_rss_total_mib"] = st["VmHWM"]
                self.save()

    def kill_resume(self, entry: dict, ours: Ours) -> None:
        kr = entry.setdefault("kill_resume", {})
        if kr.get("done") and not kr.get("errors"):
            log(f"{ours.label}: kill/resume already measured (resume): skipped")
            return
        clean = entry.get("ours", {})
        if "ingest_wall_s" not in clean:
            kr.setdefault("errors", {})["kill"] = (
                "no clean ingest of ours at this size to compare with"
            )
            self.failed = True
            self.save()
            return
        kr.clear()

        def run():
            store = self.workdir / f"ours_kill_{slug(ours.size.name)}"
            if store.exists():
                shutil.rmtree(store)
            delay = self.args.kill_after or clean["ingest_wall_s"] * self.rng.uniform(0.4, 0.6)
            kr.update(
                size=ours.size.name,
                clean_ingest_wall_s=clean["ingest_wall_s"],
                kill_after_s=delay,
                clean_papers=clean.get("papers"),
                clean_chunks=clean.get("chunks"),
            )
            cmd = [*self.runner.prefix(), *ours.ingest_cmd(store)]
            log(
                f"{ours.label}: kill/resume: ingest into a fresh store, SIGKILL after {delay:.1f} s"
            )
            with open(self.workdir / "logs" / f"{slug(ours.label)}_killed_ingest.log", "wb") as fh:
                proc = subprocess.Popen(
                    cmd,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=ours.env,
                    cwd=self.workdir,
                    start_new_session=True,
                )
                try:
                    rc = proc.wait(timeout=delay)
                    raise RuntimeError(
                        f"the ingest finished (exit {rc}) before the kill at {delay:.1f} s: "
                        "pass a smaller --kill-after"
                    )
                except subprocess.TimeoutExpired:
                    kill_group(proc.pid)
                    proc.wait()
            kr["killed_exit"] = proc.returncode
            kr.update({f"{k}_at_kill": v for k, v in ours.stats(store).items()})
            v = fd.last_json_line(
                ours.run(
                    [self.args.rag_python, "-c", VECTOR_CHECK, str(store)], "vector check at kill"
                )["stdout"]
            )
            kr["vectors_at_kill"] = v["vectors"]
            kr["orphan_vectors_at_kill"] = v["orphan_vectors"]
            log(
                f"{ours.label}: killed: {kr['papers_at_kill']:,} papers / {kr['chunks_at_kill']:,}"
                f" chunks committed, {v['vectors']:,} vectors ({v['orphan_vectors']:,} orphans)"
            )
            r = ours.run(
                ours.ingest_cmd(store),
                "resumed ingest",
                timeout=self.args.timeout,
                progress=lambda: _committed(store),
            )
            summ = parse_summary(r["stdout"] + "\n" + r["stderr"])
            kr.update(
                resumed_wall_s=r["wall_s"],
                resumed_rss_mib=r["rss_mib"],
                resumed_summary=summ.get("line"),
                resumed_already_indexed=summ.get("already_indexed"),
                resumed_new_papers=summ.get("new_papers"),
                resumed_new_chunks=summ.get("new_chunks"),
            )
            kr.update({f"final_{k}": v for k, v in ours.stats(store).items()})
            v = fd.last_json_line(
                ours.run(
                    [self.args.rag_python, "-c", VECTOR_CHECK, str(store)],
                    "vector check after resume",
                )["stdout"]
            )
            kr.update(
                final_vectors=v["vectors"],
                final_orphan_vectors=v["orphan_vectors"],
                final_missing_vectors=v["missing_vectors"],
            )
            kr["same_as_clean"] = kr["final_papers"] == clean.get("papers") and kr[
                "final_chunks"
            ] == clean.get("chunks")
            kr["no_duplicates"] = (
                v["vectors"] == v["chunks"] == kr["final_chunks"]
                and not v["orphan_vectors"]
                and not v["missing_vectors"]
            )
            kr["done"] = True
            log(
                f"{ours.label}: resumed in {dur(r['wall_s'])} ({summ.get('line')}); final"
                f" {kr['final_papers']:,} papers / {kr['final_chunks']:,} chunks / {v['vectors']:,}"
                f" vectors: same as clean: {kr['same_as_clean']}, no duplicates:"
                f" {kr['no_duplicates']}"
            )
            if not (kr["same_as_clean"] and kr["no_duplicates"]):
                raise RuntimeError(
                    f"the resumed store differs from the clean run: {kr['final_papers']:,} papers /"
                    f" {kr['final_chunks']:,} chunks / {v['vectors']:,} vectors"
                    f" ({v['orphan_vectors']:,} orphan, {v['missing_vectors']:,} missing) vs"
                    f" {clean.get('papers')} / {clean.get('chunks')}"
                )
            if not self.args.workdir:
                shutil.rmtree(store, ignore_errors=True)

        self.step(ours, kr, "kill_resume", run)


# --------------------------------------------------------------------------- report

# key, label, format, sides that have it, ratio shown
METRICS = [
    ("papers", "papers indexed (ours: rag stats; baseline: documents)", "{:,.0f}", SIDES, False),
    ("chunks", "chunks (vectors)", "{:,.0f}", SIDES, False),
    ("ingest_wall_s", "ingest wall, whole process (s; ratio <1 = faster)", "{:,.1f}", SIDES, True),
    ("throughput", "ingest throughput (abstracts/s; ratio >1 = better)", "{:,.1f}", SIDES, True),
    (
        "ingest_cpu_s",
        "ingest CPU user+sys of the client (s; ratio <1 = less)",
        "{:,.1f}",
        SIDES,
        True,
    ),
    ("ingest_rss_mib", "ingest peak RSS (MiB; ratio <1 = less)", "{:,.0f}", SIDES, True),
    (
        "server_rss_mib",
        "Chroma server peak RSS after ingest (MiB, VmHWM)",
        "{:,.0f}",
        ("server",),
        False,
    ),
    (
        "store_mib",
        "store size on disk (MiB, du; server: store dir + server data)",
        "{:,.1f}",
        SIDES,
        True,
    ),
    ("warm_p50_ms", "warm retrieval p50, hybrid (ms; ratio <1 = faster)", "{:,.1f}", SIDES, True),
    ("warm_p95_ms", "warm retrieval p95, hybrid (ms; ratio <1 = faster)", "{:,.1f}", SIDES, True),
    (
        "cold_wall_s",
        "cold `rag ask --no-llm` wall (s, median; ratio <1 = faster)",
        "{:,.2f}",
        SIDES,
        True,
    ),
    (
        "cold_rss_mib",
        "cold `rag ask --no-llm` peak RSS (MiB, median; ratio <1 = less)",
        "{:,.0f}",
        SIDES,
        True,
    ),
    ("cold_found", "cold ask lists the Palimpsa paper", "", SIDES, False),
    (
        "update_wall_s",
        f"adding {UPDATE_PAPERS} papers afterwards: `rag ingest` wall (s)",
        "{:,.1f}",
        ("ours", "server"),
        False,
    ),
    (
        "update_rss_mib",
        f"adding {UPDATE_PAPERS} papers: peak RSS (MiB)",
        "{:,.0f}",
        ("ours", "server"),
        False,
    ),
    (
        "update_keyword_equal",
        "keyword index after it equals a full rebuild's (keys, top 50 of every question)",
        "",
        ("ours", "server"),
        False,
    ),
]


def _target(key: str, entry: dict, side: str) -> tuple[str, str] | None:
    """(target text, met|missed|n/a ...) for one cell, or None when no target applies."""
    res = entry.get(side) or {}
    value = res.get(key)
    big = entry.get("data_records", 0) >= BIG
    if key == "throughput":
        base = entry.get("baseline") or {}
        if value is None:
            return None
        if base.get("not_run"):
            return (f">= {TARGETS['throughput_ratio']}x baseline", "n/a (baseline not run)")
        if not base.get("throughput"):
            return (f">= {TARGETS['throughput_ratio']}x baseline", "n/a (baseline failed)")
        return (
            f">= {TARGETS['throughput_ratio']}x baseline",
            "met" if value / base["throughput"] >= TARGETS["throughput_ratio"] else "missed",
        )
    records = entry.get("data_records", 0)
    if value is None:
        return None
    if key == "update_keyword_equal":
        return "equal", "met" if value else "missed"
    if key == "warm_p50_ms":
        limit = (
            TARGETS["warm_p50_ms"]
            if big
            else TARGETS["warm_p50_6k_ms"]
            if SIX_K[0] <= records < SIX_K[1]
            else None
        )
        base = (entry.get("baseline") or {}).get("warm_p50_ms")
        parts = ([f"<= {limit:g} ms"] if limit else []) + (["< baseline"] if base else [])
        if not parts:
            return None
        ok = (limit is None or value <= limit) and (base is None or value < base)
        return " and ".join(parts), "met" if ok else "missed"
    limits: dict[str, tuple[str, float]] = {}
    if big:
        limits.update(
            ingest_wall_s=("<= 20 min", TARGETS["ingest_100k_s"]),
            ingest_rss_mib=("<= 1.2 GB", TARGETS["ingest_100k_rss_mib"]),
            warm_p95_ms=("<= 15 ms", TARGETS["warm_p95_ms"]),
            update_wall_s=("<= 15 s", TARGETS["update_s"]),
        )
        if side == "ours":
            limits["cold_wall_s"] = ("<= 1.3 s (embedded)", TARGETS["cold_100k_s"])
    if key not in limits:
        return None
    text, limit = limits[key]
    return text, "met" if value <= limit else "missed"


def target_cell(key: str, entry: dict, sides: list[str]) -> str:
    got = {s: _target(key, entry, s) for s in sides if s != "baseline"}
    got = {s: t for s, t in got.items() if t}
    if not got:
        return ""
    text = next(iter(got.values()))[0]
    statuses = {s: t[1] for s, t in got.items()}
    if len(set(statuses.values())) == 1:
        return f"{text}: {next(iter(statuses.values()))}"
    return f"{text}: " + ", ".join(
        f"{'embedded' if s == 'ours' else s} {v}" for s, v in statuses.items()
    )


def cell(entry: dict, side: str, key: str, spec: str, sides_with: tuple) -> str:
    res = entry.get(side)
    if side not in sides_with:
        return ""
    if res is None or res.get("not_run"):
        return "not run"
    value = res.get(key)
    if value is None:
        if res.get("errors"):
            return "failed"
        return "n/a"
    return fd.fmt(value, spec)


def ratio_cell(entry: dict, side: str, key: str) -> str:
    base = entry.get("baseline") or {}
    if base.get("not_run"):
        return "not run"
    o, b = (entry.get(side) or {}).get(key), base.get(key)
    if isinstance(o, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{o / b:.2f}x"
    return "n/a"


def result_rows(results: dict, sides: list[str]) -> list[list[str]]:
    rows = []
    sizes = results["sizes"]
    for key, label, spec, sides_with, show_ratio in METRICS:
        if not any((sizes[n].get(s) or {}).get(key) is not None for n in sizes for s in sides):
            continue
        for name, entry in sizes.items():
            row = [label, name]
            row += [cell(entry, s, key, spec, sides_with) for s in sides]
            if "baseline" in sides:
                row += [
                    ratio_cell(entry, s, key) if show_ratio and s in sides_with else ""
                    for s in sides
                    if s != "baseline"
                ]
            row.append(target_cell(key, entry, sides))
            rows.append(row)
    return rows


def result_header(sides: list[str]) -> list[str]:
    h = ["metric", "size"] + [SIDE_NAMES[s] for s in sides]
    if "baseline" in sides:
        h += [
            "ratio embedded/baseline" if s == "ours" else "ratio server/baseline"
            for s in sides
            if s != "baseline"
        ]
    return h + ["target"]


SUMMARY_TARGETS = [
    ("ingest throughput >= 2.5x baseline at every size", "throughput", False),
    ("100k ingest <= 20 min", "ingest_wall_s", True),
    ("100k ingest peak RSS <= 1.2 GB (1,144 MiB)", "ingest_rss_mib", True),
    (
        (
            "warm hybrid p50 below the baseline's dense-only p50 at every size; <= 5 ms at 6k, <="
            " 10 ms at 100k"
        ),
        "warm_p50_ms",
        False,
    ),
    ("warm hybrid p95 <= 15 ms at 100k", "warm_p95_ms", True),
    ("cold `rag ask --no-llm` <= 1.3 s at 100k, embedded", "cold_wall_s", True),
    (f"adding {UPDATE_PAPERS} papers to the 100k store <= 15 s", "update_wall_s", True),
    (
        "keyword index after an update equals a full rebuild's, at every size",
        "update_keyword_equal",
        False,
    ),
]


def summary_rows(results: dict, sides: list[str]) -> list[list[str]]:
    rows = []
    for text, key, big_only in SUMMARY_TARGETS:
        row = [text]
        for side in [s for s in sides if s != "baseline"]:
            parts, statuses = [], []
            for name, entry in results["sizes"].items():
                if big_only and entry.get("data_records", 0) < BIG:
                    continue
                t = _target(key, entry, side)
                if t is None:
                    continue
                value = entry[side][key]
                if key == "throughput" and t[1] in ("met", "missed"):
                    shown = f"{value / entry['baseline']['throughput']:.2f}x"
                elif t[1] not in ("met", "missed"):
                    shown = t[1]
                elif key == "update_keyword_equal":
                    shown = "yes" if value else "no"
                else:
                    shown = fd.fmt(value, "{:,.1f}" if key != "cold_wall_s" else "{:.2f}")
                parts.append(f"{name}: {shown}")
                statuses.append(t[1])
            decided = [s for s in statuses if s in ("met", "missed")]
            if not decided:
                no_big = big_only and not any(
                    e.get("data_records", 0) >= BIG for e in results["sizes"].values()
                )
                verdict = "not evaluated" + (
                    " (no 100k size)" if no_big else " (does not apply)" if not statuses else ""
                )
            else:
                verdict = "MISSED" if "missed" in decided else "met"
                if len(decided) < len(statuses):
                    verdict += " (where evaluated)"
            row.append(verdict + (f" ({'; '.join(parts)})" if parts else ""))
        rows.append(row)
    return rows


def kill_rows(results: dict) -> list[list[str]]:
    rows = []
    for name, entry in results["sizes"].items():
        kr = entry.get("kill_resume")
        if not kr:
            continue
        if kr.get("errors") and not kr.get("done"):
            rows.append(
                [
                    f"{name}: kill/resume",
                    "FAILED: " + short_error(next(iter(kr["errors"].values()))),
                ]
            )
            continue

        def f(k, spec="{:,.0f}", kr=kr):
            return fd.fmt(kr.get(k), spec)

        rows += [
            [f"{name}: clean ingest wall (s)", f("clean_ingest_wall_s", "{:,.1f}")],
            [f"{name}: SIGKILL after (s)", f("kill_after_s", "{:,.1f}")],
            [
                f"{name}: papers / chunks committed at the kill",
                f"{f('papers_at_kill')} / {f('chunks_at_kill')}",
            ],
            [
                f"{name}: vectors in Chroma at the kill (orphans)",
                f"{f('vectors_at_kill')} ({f('orphan_vectors_at_kill')})",
            ],
            [f"{name}: resumed ingest wall (s)", f("resumed_wall_s", "{:,.1f}")],
            [
                f"{name}: resumed run: already indexed / new papers",
                f"{f('resumed_already_indexed')} / {f('resumed_new_papers')}",
            ],
            [
                f"{name}: final papers / chunks (clean run)",
                (
                    f"{f('final_papers')} / {f('final_chunks')} "
                    f"({f('clean_papers')} / {f('clean_chunks')})"
                ),
            ],
            [
                f"{name}: final vectors (orphan / missing)",
                (
                    f"{f('final_vectors')} ({f('final_orphan_vectors')} / "
                    f"{f('final_missing_vectors')})"
                ),
            ],
            [
                f"{name}: same as the clean run; no duplicates",
                f"{f('same_as_clean', '')}; {f('no_duplicates', '')}",
            ],
        ]
    return rows


def errors_in(results: dict):
    """(size, side, step, message) of every failed step in the results."""
    for n, e in results["sizes"].items():
        for s in (*SIDES, "kill_resume"):
            for what, msg in ((e.get(s) or {}).get("errors") or {}).items():
                yield n, s, what, msg


def short_error(msg: str) -> str:
    """'<label> failed (exit N): <last line of stderr>' from a Runner error (traceback dropped)."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    head = lines[0].split(": ", 1)[0] if len(lines) > 1 else lines[0]
    text = f"{head}: {lines[-1]}" if len(lines) > 1 else head
    return text.replace("|", "/")[:240]


def render(results: dict, sides: list[str], markdown: bool) -> str:
    table = fd.md_table if markdown else fd.text_table
    meta = results["meta"]
    out = []
    if markdown:
        out.append("# Scale benchmark: `rag` vs the LlamaIndex quickstart, 76 to ~100k abstracts\n")
    out.append(
        "\n".join(
            (f"- {k}: {v}" if markdown else f"{k}: {v}") for k, v in meta.get("about", {}).items()
        )
    )
    size_rows = [
        [
            n,
            e.get("kind", ""),
            f"{e.get('data_records', 0):,}",
            f"{e.get('abstracts_fed', 0):,}",
            ", ".join(f"{k} {v:,}" for k, v in (e.get("sources") or {}).items()) or "corpus/ only",
        ]
        for n, e in results["sizes"].items()
    ]
    out.append("\n" + ("## Corpora" if markdown else "== corpora ==") + "\n")
    out.append(
        table(
            ["size", "kind", "data records", "abstracts fed (+ seeds)", "data records per source"],
            size_rows,
        )
    )
    out.append("\n" + ("## Results" if markdown else "== results ==") + "\n")
    out.append(table(result_header(sides), result_rows(results, sides)))
    out.append("\n" + ("## Targets" if markdown else "== targets ==") + "\n")
    out.append(
        table(
            ["target"] + [SIDE_NAMES[s] for s in sides if s != "baseline"],
            summary_rows(results, sides),
        )
    )
    kr = kill_rows(results)
    if kr:
        head = (
            "## Kill and resume (ours, embedded)"
            if markdown
            else "== kill and resume (ours, embedded) =="
        )
        out.append("\n" + head + "\n")
        out.append(table(["check", "value"], kr))
    errors = list(errors_in(results))
    if errors:
        out.append("\n" + ("## Failed steps" if markdown else "== failed steps ==") + "\n")
        out.append(
            table(
                ["size", "side", "step", "error (full text in the JSON)"],
                [[n, s, w, short_error(m)] for n, s, w, m in errors],
            )
        )
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def default_rag_python() -> str:
    if (Path(sys.executable).parent / "rag").exists():
        return sys.executable
    return "/work/venvs/dev/bin/python"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"corpus sizes (default {DEFAULT_SIZES}; any N or Nk = seeds + first N data records)",
    )
    p.add_argument(
        "--baseline-sizes",
        type=parse_sizes,
        help="sizes at which the baseline runs (default: all of --sizes; `none` for none); "
        "elsewhere its column and ratios say 'not run'",
    )
    p.add_argument(
        "--data",
        type=Path,
        action="append",
        help=(
            "a JSONL(.gz) source of data records, in order (repeatable; default: the four files of "
            f"{SHARED_DATA})"
        ),
    )
    p.add_argument(
        "--server",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run ours against a Chroma server (`chroma run`, RAG_CHROMA_URL) (default: on)",
    )
    p.add_argument(
        "--server-sizes",
        type=parse_sizes,
        help="sizes at which the Chroma server variant runs (default: all of --sizes)",
    )
    p.add_argument(
        "--kill-resume",
        action="store_true",
        help="at the largest size: SIGKILL an ingest about half-way, resume it, check the store",
    )
    p.add_argument(
        "--kill-after",
        type=float,
        metavar="SECONDS",
        help="kill the ingest after SECONDS (default: 0.4-0.6 x the clean ingest's wall)",
    )
    p.add_argument("--seed", type=int, help="random seed for the kill time")
    p.add_argument(
        "--rag-python",
        default=default_rag_python(),
        help="python of the venv where the project is installed (default: %(default)s)",
    )
    p.add_argument("--rag-cli", help="the `rag` script (default: beside --rag-python)")
    p.add_argument("--chroma-cli", help="the `chroma` script (default: beside --rag-python)")
    p.add_argument(
        "--rag-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for ours (repeatable; RAG_* variables of the caller are "
        "removed), e.g. RAG_EMBED_BACKEND=onnx",
    )
    p.add_argument(
        "--baseline-python",
        default="/work/venvs/baseline/bin/python",
        help="python of the baseline venv (default: %(default)s)",
    )
    p.add_argument(
        "--plot-python",
        default="/work/venvs/baseline/bin/python",
        help="a python with matplotlib, for --plot (default: %(default)s)",
    )
    p.add_argument("--question", default=fd.COLD_QUESTION, help="the cold-ask question")
    p.add_argument(
        "--runs", type=int, default=3, help="cold-ask runs per side and size (median reported)"
    )
    p.add_argument(
        "--repeats", type=int, default=5, help=f"warm passes over the {len(QUESTIONS)} questions"
    )
    p.add_argument(
        "--timeout", type=float, default=6 * 3600, help="seconds before an ingest is killed"
    )
    p.add_argument(
        "--heartbeat", type=float, default=300, help="seconds between progress lines of a long run"
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each size, wait up to SECONDS for the 1-min load average to fall below 1.0",
    )
    p.add_argument(
        "--no-netns", action="store_true", help="do not run in an empty network namespace"
    )
    p.add_argument(
        "--workdir",
        type=Path,
        help="keep inputs, stores and logs here (default: a temp dir, removed)",
    )
    p.add_argument("--markdown", type=Path, help="write the tables as markdown to this file")
    p.add_argument(
        "--json", type=Path, help="write the raw results to this file (after every measurement)"
    )
    p.add_argument(
        "--resume-json",
        type=Path,
        help="results of an earlier run: skip what it holds (and keep saving to it unless --json)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        help="write a PNG of latency, throughput and cold ask against corpus size",
    )
    args = p.parse_args(argv)

    args.sources = [x.resolve() for x in (args.data or DEFAULT_SOURCES)]
    bad = [e for e in args.rag_env if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        p.error(f"--rag-env needs KEY=VALUE, got {', '.join(bad)}")
    args.rag_env = dict(e.split("=", 1) for e in args.rag_env)
    if not args.sizes:
        p.error("no sizes")
    if args.baseline_sizes is None:
        args.baseline_sizes = list(args.sizes)
    if args.server_sizes is None:
        args.server_sizes = list(args.sizes) if args.server else []
    elif not args.server:
        p.error("--server-sizes with --no-server")
    for flag, chosen in (
        ("--baseline-sizes", args.baseline_sizes),
        ("--server-sizes", args.server_sizes),
    ):
        unknown = {s.name for s in chosen} - {s.name for s in args.sizes}
        if unknown:
            p.error(f"{flag} {', '.join(sorted(unknown))} not in --sizes")
    rag_dir = Path(args.rag_python).parent
    args.rag_cli = args.rag_cli or str(rag_dir / "rag")
    args.chroma_cli = args.chroma_cli or str(rag_dir / "chroma")
    if not Path(args.rag_cli).exists():
        p.error(
            f"{args.rag_cli} not found: install the project (pip install -e {PROJECT_DIR}) or pass"
            " --rag-python"
        )
    if args.server_sizes and not Path(args.chroma_cli).exists():
        p.error(f"{args.chroma_cli} not found: pass --chroma-cli or --no-server")
    if args.baseline_sizes and not Path(args.baseline_python).exists():
        p.error(
            f"{args.baseline_python} not found: run bench/baseline/setup_venv.sh or"
            " --baseline-sizes none"
        )
    if any(s.kind != "seeds" for s in args.sizes):
        missing = [
            str(x)
            for x in (
                args.sources[:1]
                if all(s.kind in ("seeds", "first_file") for s in args.sizes)
                else args.sources
            )
            if not x.exists()
        ]
        if missing:
            p.error(f"data not found: {', '.join(missing)} (see --data)")
    if args.kill_after is not None and args.kill_after <= 0:
        p.error("--kill-after must be positive")

    workdir, tmp = fd.make_workdir(args.workdir, "rag-scale-")
    out_json = (args.json or args.resume_json or workdir / "scale.json").resolve()

    results = {"meta": {}, "sizes": {}}
    if args.resume_json:
        if args.resume_json.exists():
            results = json.loads(args.resume_json.read_text(encoding="utf-8"))
            results.setdefault("sizes", {})
            results.setdefault("meta", {})
            log(f"resuming from {args.resume_json}: {', '.join(results['sizes']) or 'nothing yet'}")
        else:
            log(f"{args.resume_json} does not exist yet: starting afresh")
    # Only the sizes of this run, in its order (others kept under "other_sizes").
    old = results["sizes"]
    results["sizes"] = {s.name: old.pop(s.name) for s in args.sizes if s.name in old}
    if old:
        results.setdefault("other_sizes", {}).update(old)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    bench = None
    status = 0
    load_before = os.getloadavg()
    try:
        bench = Bench(args, workdir, results, out_json)
        bench.seeds = fd.seed_records()
        sides = (
            ["ours"]
            + (["server"] if args.server_sizes else [])
            + (["baseline"] if args.baseline_sizes else [])
        )
        results["meta"].update(
            {
                "started": results["meta"].get("started") or time.strftime("%Y-%m-%d %H:%M:%S"),
                "sides": sides,
                "argv": sys.argv[1:] if argv is None else argv,
                "about": {
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                    "machine": (
                        f"{os.cpu_count()} cores,"
                        f" {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}"
                        " GiB RAM"
                    ),
                    "sources": ", ".join(x.name for x in args.sources),
                    "cold ask": (
                        f"{args.question!r}, {args.runs} fresh process(es) per side and size,"
                        " median"
                    ),
                    "warm retrieval": (
                        f"{len(QUESTIONS)} questions x {args.repeats} after one warm-up pass, k=5; "
                        "ours RAG.search (hybrid), baseline retriever.retrieve"
                    ),
                    "throughput": (
                        "abstracts fed (seeds + data records with an abstract) / whole-process"
                        " ingest wall"
                    ),
                    "network": (
                        "not isolated"
                        if not bench.runner.netns
                        else "empty network namespace (unshare -n)"
                        + (
                            ""
                            if not args.server_sizes
                            else (
                                "; the Chroma server and its clients share one namespace with only"
                                " loopback up (nsenter -n)"
                                if bench.server_netns
                                else "; the Chroma server variant runs on the host's loopback"
                            )
                        )
                    ),
                    "peak RSS": (
                        ("/usr/bin/time -v" if bench.runner.time_bin else "os.wait4 rusage")
                        + "; the Chroma server's from /proc/PID/status VmHWM"
                    ),
                    "baseline": (
                        "LlamaIndex quickstart: VectorStoreIndex.from_documents + ChromaVectorStore"
                        " + HuggingFaceEmbedding(all-MiniLM-L6-v2, torch CPU),"
                        " as_retriever(similarity_top_k=5); documents: seeds as in"
                        " bench/baseline/foundation.py, data records as 'title\\nabstract'"
                    ),
                    "baseline sizes": ", ".join(s.name for s in args.baseline_sizes) or "none",
                    "Chroma server sizes": ", ".join(s.name for s in args.server_sizes) or "none",
                    "environment of ours": (
                        " ".join(f"{k}={v}" for k, v in args.rag_env.items())
                        or "defaults (RAG_* removed)"
                    ),
                },
            }
        )
        bench.save()
        largest = max(args.sizes, key=lambda s: expected_records(s, args.sources))
        base_names = {s.name for s in args.baseline_sizes}
        server_names = {s.name for s in args.server_sizes}
        for size in args.sizes:
            bench.bench_size(
                size,
                size.name in base_names,
                size.name in server_names,
                args.kill_resume and size is largest,
            )
        if bench.failed or any(errors_in(results)):
            status = 1
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        status = 130
    except Exception as exc:  # noqa: BLE001
        log(f"FAILED: {exc}")
        status = 1
    finally:
        load_after = os.getloadavg()
        results["meta"].setdefault("about", {})["load average (1 min) start / end"] = (
            f"{load_before[0]:.2f} / {load_after[0]:.2f}"
        )
        if max(load_before[0], load_after[0]) > (os.cpu_count() or 1):
            log(
                "WARNING: the machine was busy (load above the core count): wall times are inflated"
            )
        if bench is not None:
            bench.save()
        else:
            out_json.parent.mkdir(parents=True, exist_ok=True)
            out_json.write_text(json.dumps(results, indent=2), encoding="utf-8")
        sides = results["meta"].get("sides") or ["ours"]
        if results["sizes"]:
            print(render(results, sides, markdown=False))
            if args.markdown:
                args.markdown.parent.mkdir(parents=True, exist_ok=True)
                args.markdown.write_text(render(results, sides, markdown=True), encoding="utf-8")
                log(f"markdown written to {args.markdown}")
            if args.plot:
                plot(args, out_json)
        if args.json or args.resume_json:
            log(f"results written to {out_json}")
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


def plot(args, out_json: Path) -> None:
    if not (Path(args.plot_python).exists() or shutil.which(args.plot_python)):
        log(f"note: no plot: {args.plot_python} not found (pass --plot-python with matplotlib)")
        return
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            [args.plot_python, str(PLOTTER), str(out_json), str(args.plot)],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            env=fd.clean_env({"MPLBACKEND": "Agg"}),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"note: the plot failed ({exc}); the tables are written")
        return
    if r.returncode != 0:
        tail = " ".join(r.stderr.strip().splitlines()[-3:])
        log(f"note: the plot failed ({tail}); the tables are written")
    else:
        log(f"plot written to {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
