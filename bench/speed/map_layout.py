#!/usr/bin/env python3
"""The papers' map at scale: layout time and memory, how well it keeps neighbours, page load in
Chromium.

  python -m bench.speed.map_layout --store 6k=/path/to/store --store 100k=/path/to/store [--json
out.json]

For each store (read only; nothing is written to it), in a fresh child process: the papers' vectors
read from Chroma, the principal axes, the t-SNE layout, the k-means clusters and their labels, each
timed, with the child's peak RSS and CPU seconds. The baseline in the same run is the cheap layout:
the papers' two principal axes (what a map costs without t-SNE); with --compare-sample N, also t-SNE
on N papers with the rest placed among them (the cheaper way to lay out a big corpus). Then:

- neighbours kept (trustworthiness share): of each paper's 10 nearest neighbours on the map, the
  share that are among its 50 nearest by embedding (cosine); every paper up to --trust-all papers,
  else a random sample of --trust-sample papers; for t-SNE and for the baseline, and their ratio;
- the map page (rag/paper_map/page.py) for that map: its size, and its load time in headless
  Chromium (from navigation to `window.ragMap.ready`, the first frame drawn), median of --page-runs
  fresh pages.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import REPO, machine_load, write_json

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--enable-unsafe-swiftshader"]


def child(
    store: str, html_out: str, trust_all: int, trust_sample: int, compare_sample: int
) -> dict:
    """Lay out one store's map, phase by phase (run in its own process for a clean peak RSS)."""
    from rag import RAG
    from rag.paper_map.layout import (
        PCA_DIMS,
        PaperMap,
        _fit_box,
        _titles,
        _unit,
        cluster_labels,
        clusters,
        layout,
        map_data,
        paper_vectors,
        principal_axes,
        trustworthiness_share,
    )
    from rag.paper_map.page import render_map_html

    rag = RAG(store_dir=store, llm="none")
    out: dict = {}
    t0 = time.perf_counter()
    rows = rag.store.chunk_papers_after(-1)
    ids, vectors = paper_vectors(rag.store, rows)
    t1 = time.perf_counter()
    mean, axes, proj = principal_axes(vectors, PCA_DIMS)
    t2 = time.perf_counter()
    xy, method = layout(proj)
    t3 = time.perf_counter()
    cluster, centres = clusters(xy)
    t4 = time.perf_counter()
    labels = cluster_labels(cluster, len(centres), _titles(rag.store, ids))
    t5 = time.perf_counter()
    out.update(
        papers=len(ids),
        chunks=len(rows),
        method=method,
        vectors_s=t1 - t0,
        pca_s=t2 - t1,
        layout_s=t3 - t2,
        clusters_s=t4 - t3,
        labels_s=t5 - t4,
        total_s=t5 - t0,
        clusters=len(labels),
        labels=labels[:12],
    )
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.update(peak_rss_mib=ru.ru_maxrss / 1024, cpu_s=ru.ru_utime + ru.ru_stime)
    b0 = time.perf_counter()
    base = _fit_box(proj[:, :2])
    # the baseline needs the axes too
    out["baseline_layout_s"] = time.perf_counter() - b0 + (t2 - t1)
    sample = None if len(ids) <= trust_all else trust_sample
    s0 = time.perf_counter()
    out["trust"] = trustworthiness_share(vectors, xy, sample=sample)
    out["trust_baseline"] = trustworthiness_share(vectors, base, sample=sample)
    out.update(trust_over=len(ids) if sample is None else sample, trust_s=time.perf_counter() - s0)
    # the cheaper way: t-SNE on a sample, the rest placed
    if compare_sample and len(ids) > compare_sample:
        f0 = time.perf_counter()
        sampled, _ = layout(proj, sample=compare_sample)
        out["sampled_layout_s"] = time.perf_counter() - f0
        out["trust_sampled"] = trustworthiness_share(vectors, sampled, sample=sample)
    pmap = PaperMap(
        ids,
        xy,
        cluster,
        labels,
        centres,
        mean,
        axes,
        _unit(proj),
        rows[-1][0],
        len(ids),
        method,
        round(t5 - t0, 2),
    )
    p0 = time.perf_counter()
    page = render_map_html(map_data(rag.store, pmap))
    out["page_build_s"] = time.perf_counter() - p0
    Path(html_out).write_text(page, encoding="utf-8")
    out["page_mib"] = len(page.encode()) / 2**20
    return out


def page_load(html: Path, runs: int) -> dict:
    from playwright.sync_api import sync_playwright

    times, renderer = [], None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            start = time.perf_counter()
            page.goto(html.as_uri())
            page.wait_for_function("window.ragMap && window.ragMap.ready", timeout=300_000)
            times.append(time.perf_counter() - start)
            renderer = page.evaluate("window.ragMap.renderer")
            page.close()
        browser.close()
    return {
        "page_load_s": statistics.median(times),
        "page_load_runs_s": [round(t, 3) for t in times],
        "renderer": renderer,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--store", action="append", default=[], metavar="NAME=PATH", help="a store to map (repeat)"
    )
    p.add_argument(
        "--trust-all",
        type=int,
        default=20_000,
        help="measure neighbours over every paper up to this",
    )
    p.add_argument(
        "--trust-sample", type=int, default=5_000, help="else over this many random papers"
    )
    p.add_argument("--page-runs", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--compare-sample",
        type=int,
        default=0,
        metavar="N",
        help=(
            "also lay out with t-SNE on N papers and the rest placed (the cheaper way), where there"
            " are more"
        ),
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        store, html, trust_all, trust_sample, compare_sample = args.child
        print(
            json.dumps(child(store, html, int(trust_all), int(trust_sample), int(compare_sample)))
        )
        return 0
    if not args.store:
        p.error("give at least one --store NAME=PATH")
    results = {}
    tmp = Path(tempfile.mkdtemp(prefix="map-bench-"))
    for spec in args.store:
        name, _, path = spec.partition("=")
        html = tmp / f"map_{name}.html"
        print(f"[map] {name}: laying out {path}", file=sys.stderr, flush=True)
        # The child is this module again (`-m` from the repository root, so `bench` and `rag`
        # import).
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.speed.map_layout",
                "--child",
                str(Path(path).resolve()),
                str(html),
                str(args.trust_all),
                str(args.trust_sample),
                str(args.compare_sample),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return 1
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"[map] {name}: page load in Chromium", file=sys.stderr, flush=True)
        res.update(page_load(html, args.page_runs))
        res["load"] = machine_load()
        results[name] = res
        if args.json:
            write_json(args.json, results)
    rows = [
        ("papers (chunks)", lambda r: f"{r['papers']:,} ({r['chunks']:,})"),
        ("vectors read from Chroma (s)", lambda r: f"{r['vectors_s']:.1f}"),
        ("principal axes (s)", lambda r: f"{r['pca_s']:.2f}"),
        ("layout method", lambda r: r["method"]),
        ("layout (s)", lambda r: f"{r['layout_s']:.1f}"),
        ("k-means clusters (s)", lambda r: f"{r['clusters_s']:.1f}"),
        ("cluster labels (s)", lambda r: f"{r['labels_s']:.1f}"),
        ("whole map (s)", lambda r: f"{r['total_s']:.1f}"),
        ("baseline: 2 principal axes (s)", lambda r: f"{r['baseline_layout_s']:.2f}"),
        ("peak RSS of the layout process (MiB)", lambda r: f"{r['peak_rss_mib']:,.0f}"),
        ("CPU user+sys (s)", lambda r: f"{r['cpu_s']:.1f}"),
        ("neighbours kept: the map (10 of 50)", lambda r: f"{r['trust']:.3f}"),
        ("neighbours kept: baseline", lambda r: f"{r['trust_baseline']:.3f}"),
        ("ratio map / baseline", lambda r: f"{r['trust'] / max(r['trust_baseline'], 1e-9):.1f}x"),
        (
            "cheaper: t-SNE on a sample, the rest placed (s)",
            lambda r: f"{r['sampled_layout_s']:.1f}" if "sampled_layout_s" in r else "-",
        ),
        (
            "cheaper: neighbours kept",
            lambda r: f"{r['trust_sampled']:.3f}" if "trust_sampled" in r else "-",
        ),
        ("neighbours measured over (papers)", lambda r: f"{r['trust_over']:,}"),
        ("clusters", lambda r: str(r["clusters"])),
        ("map page size (MiB)", lambda r: f"{r['page_mib']:.1f}"),
        ("map page load in Chromium (s, median)", lambda r: f"{r['page_load_s']:.2f}"),
        ("renderer", lambda r: r["renderer"]),
        ("machine load after the page loads", lambda r: r["load"]),
    ]
    names = list(results)
    print("| measure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, f in rows:
        print(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    for n in names:
        print(f"\n{n} labels (largest clusters first): " + "; ".join(results[n]["labels"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
