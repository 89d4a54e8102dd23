"""Plot `python -m bench.speed.scale` results: warm retrieval latency, ingest throughput and cold
ask against corpus size.

Run by a python with matplotlib (bench.speed.scale runs this file with the baseline venv's python by
default), from the repository root: python -m bench.speed.plot_scale bench/results/scale.json
docs/scale.png It imports nothing from the project, so `python bench/speed/plot_scale.py ...` works
too (that is how bench.speed.scale runs it).
"""

from __future__ import annotations

import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIDES = {
    "ours": ("ours (embedded Chroma)", "tab:blue", "o"),
    "server": ("ours (Chroma server)", "tab:green", "s"),
    "baseline": ("LlamaIndex quickstart", "tab:red", "^"),
}


def series(sizes: dict, side: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for entry in sizes.values():
        value = (entry.get(side) or {}).get(key)
        if isinstance(value, (int, float)) and entry.get("abstracts_fed"):
            xs.append(entry["abstracts_fed"])
            ys.append(value)
    order = sorted(range(len(xs)), key=xs.__getitem__)
    return [xs[i] for i in order], [ys[i] for i in order]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        results = json.load(fh)
    sizes = results.get("sizes") or {}
    if not sizes:
        print("no sizes in the results", file=sys.stderr)
        return 1
    fig, (lat, thr, cold) = plt.subplots(1, 3, figsize=(16, 4.8))
    for side, (label, color, marker) in SIDES.items():
        x, y = series(sizes, side, "warm_p50_ms")
        if x:
            lat.plot(x, y, marker=marker, color=color, label=f"{label} p50")
        x, y = series(sizes, side, "warm_p95_ms")
        if x:
            lat.plot(
                x, y, marker=marker, color=color, linestyle="--", alpha=0.7, label=f"{label} p95"
            )
        x, y = series(sizes, side, "throughput")
        if x:
            thr.plot(x, y, marker=marker, color=color, label=label)
        x, y = series(sizes, side, "cold_wall_s")
        if x:
            cold.plot(x, y, marker=marker, color=color, label=label)
    # Issue 18's targets, which apply at 100k (and p50 <= 5 ms at 6k).
    lat.axhline(10, color="grey", linestyle=":", linewidth=1, label="target p50 <= 10 ms at 100k")
    lat.axhline(15, color="grey", linestyle="-.", linewidth=1, label="target p95 <= 15 ms at 100k")
    cold.axhline(
        1.3, color="grey", linestyle=":", linewidth=1, label="target <= 1.3 s at 100k, embedded"
    )
    lat.set(title="Warm retrieval latency (k=5; ours hybrid)", ylabel="ms", yscale="log")
    thr.set(title="Ingest throughput (whole process)", ylabel="abstracts / s", yscale="log")
    cold.set(title="Cold ask without LLM (fresh process)", ylabel="s", ylim=(0, None))
    ticks = sorted(
        (e["abstracts_fed"], name) for name, e in sizes.items() if e.get("abstracts_fed")
    )
    for ax in (lat, thr, cold):
        ax.set_xscale("log")
        ax.set_xticks([t for t, _ in ticks], [f"{name}\n{t:,}" for t, name in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("corpus size (size name / abstracts fed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    date = (results.get("meta") or {}).get("about", {}).get("date", "")
    fig.suptitle(f"rag vs the LlamaIndex quickstart at scale {date}".strip(), fontsize=11)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
