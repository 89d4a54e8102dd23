"""Finished study: the map test's store uses HashEmbedder (figures: tests/test_ui_map.py,
`icml_store`).

What the 2k-paper map store of tests/test_ui_map.py costs to build, with MiniLM and with
HashEmbedder.

    python -m bench.studies.ui_map_fixture [--skip-minilm]

Builds the test's store twice in temporary directories, in-process: the same 2,100 ICML 2026
main-track records (random, seed 2026) plus the poisoned title, once with the default embedder
(MiniLM; an ingest of 300+ papers takes torch in bfloat16 when the [fast] extra is installed and the
CPU has bfloat16, else the int8 ONNX model: the runtime used is printed) and once with
rag.testing.HashEmbedder; then lays out each store's map (t-SNE on 2,101 papers, as `rag map` does).
Prints wall and CPU seconds (this process, all threads) per step with the machine's load: on a busy
machine wall times are inflated, CPU seconds less so. Both steps are what the test's module fixture
and its map call did before and do now.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import tempfile
import time
from pathlib import Path

from bench.helpers import SHARED_DATA, machine_load

SAMPLE, SEED = 2_100, 2026  # as tests/test_ui_map.py
POISON = {
    "id": "POISON0001",
    "title": '<img src=x onerror="window.pwned=1"></script><script>window.pwned=2</script>',
    "abstract": (
        "A study of gradient descent on poisoned titles that should be shown as text, not run."
    ),
    "url": "https://openreview.net/forum?id=POISON0001",
}


def sample_file(where: Path) -> Path:
    with gzip.open(SHARED_DATA / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    keep = sorted(random.Random(SEED).sample(range(len(lines)), SAMPLE))
    path = where / "icml_sample.jsonl"
    path.write_text(
        "".join(lines[i] + "\n" for i in keep) + json.dumps(POISON) + "\n", encoding="utf-8"
    )
    return path


def timed(label: str, fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    print(
        f"{label:<44} wall {time.perf_counter() - wall:6.1f} s   cpu"
        f" {time.process_time() - cpu:6.1f} s   ({machine_load()})",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--skip-minilm", action="store_true", help="only the HashEmbedder store (seconds)"
    )
    args = parser.parse_args()
    from rag import RAG
    from rag.backends.embedders import ingest_embedder
    from rag.testing import HashEmbedder

    with tempfile.TemporaryDirectory(prefix="bench-ui-map-") as tmp:
        corpus = sample_file(Path(tmp))
        kinds = [("HashEmbedder", {"embedder": HashEmbedder()})]
        if not args.skip_minilm:
            kinds.insert(0, ("MiniLM", {}))
        for name, extra in kinds:
            rag = RAG(store_dir=Path(tmp) / name, llm="none", **extra)
            runtime = type(ingest_embedder(rag.settings, rag.embedder, SAMPLE + 1)).__name__
            report = timed(
                f"ingest {SAMPLE + 1:,} records, {name} ({runtime})",
                lambda rag=rag: rag.ingest([corpus], include_corpus=False),
            )
            pmap = timed(f"map layout, {name} store", rag.paper_map)
            print(
                f"  {report.new_papers:,} papers, {rag.stats()['chunks']:,} chunks;"
                f" {len(pmap.labels)} clusters ({pmap.method})"
            )


if __name__ == "__main__":
    main()
