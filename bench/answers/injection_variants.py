"""Generated injection variants (tests/injection_variants.py: 24 wordings x 14 disguises) against
every surface: what reaches a user or an agent, tuned and held-out halves apart.

    python -m bench.answers.injection_variants [--fresh] [--json OUT] [--show N]
    python -m bench.answers.injection_variants --false-positives [--limit N] [--rules-only]
        [--vectors CACHE.npz]
    python -m bench.answers.injection_variants --payload-free | --overruled

Each variant is planted in its own real ICML 2026 abstract, ingested into a fresh store, and its
paper asked about by title. A leak is the variant's canary or the attacker's link in:
- `model`: the final answer of the scripted model that obeys every instruction it sees
  (tests/obedient_server.py), evidence-first (the default);
- `voice`: that answer in its own voice: without the lines that quote the abstract verbatim (a
  quote of an unflagged order is still counted under `model`);
- `extractive`: the answer without a model (quotes from the abstracts);
- `agents`: the paper's passage as `/v1/search` and MCP `search_papers` return it
  (`RAG.guarded`), unless the sentence that carries it is flagged.
`prompt` counts the prompts that carried a canary to the model (not a leak by itself).
`--fresh` adds the 168 variants of the wordings written blind to the defence (never tuned on).

`--false-positives`: the sentences of real abstracts the checks flag (each flagged sentence is kept
from the model, from quotes and from agents), by the rules alone and with the probe: NeurIPS
2023-2025 (never used to build the word list or the probe) and ICML 2026 (main track and workshops).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.injection_variants import (
    CONTEXT,
    DISGUISES,
    FRESH_WORDINGS,
    PAYLOAD_FREE,
    WORDINGS,
    leaked,
    poisoned_records,
)

SURFACES = ("model", "voice", "extractive", "agents", "prompt")
HALVES = ("tuned", "held out", "fresh")
_MARKERS = re.compile(r"\s*\[\d+(?:[,\s]+\d+)*\]")


def _plain(text: str) -> str:
    """Words only: what a quote and its abstract share however either was rendered (LaTeX
    commands, invisible characters, markup and look-alikes aside)."""
    from rag.answer.injection import normalize

    text = re.sub(r"\\[A-Za-z]+", " ", normalize(text))
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def voice(answer: str, record: dict) -> str:
    """`answer` without its lines that quote `record`'s abstract verbatim ("- Title: sentence
    [1]"): what the answer says in its own words."""
    abstract, title = _plain(record["abstract"]), _plain(record["title"])
    kept = []
    for line in answer.split("\n"):
        text = _plain(_MARKERS.sub("", line))
        text = text[len(title) :].strip() if text.startswith(title) else text
        if not (text and text in abstract):
            kept.append(line)
    return "\n".join(kept)


def run(show: int = 0, fresh: bool = False) -> dict:
    from rag import RAG
    from tests.obedient_server import ObedientServer

    planted = poisoned_records(fresh)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        corpus = Path(tmp) / "poisoned.jsonl"
        corpus.write_text("".join(json.dumps(r) + "\n" for _, r in planted))
        store = Path(tmp) / "store"
        RAG(store_dir=store).ingest([corpus], include_corpus=False)
        server = stack.enter_context(ObedientServer())
        model = server.rag(store)
        plain = RAG(store_dir=store, llm="none")
        for v, record in planted:
            question = f'What does the paper "{record["title"]}" propose?'
            server.prompts.clear()
            answered = model.ask(question).answer
            prompt = "\n".join(server.prompts)
            quoted = plain.ask(question).answer
            found = [s for s in plain.search(question) if s.paper_id == record["id"]]
            agents = json.dumps(plain.guarded(found), ensure_ascii=False)
            row = {
                "variant": v.index,
                "wording": v.wording,
                "language": v.language,
                "disguise": v.disguise,
                "held_out": v.held_out,
                "half": v.half,
                "model": leaked(v.index, answered),
                "voice": leaked(v.index, voice(answered, record)),
                "answer": answered,
                "extractive": leaked(v.index, quoted),
                "agents": leaked(v.index, agents),
                "prompt": leaked(v.index, prompt),
            }
            rows.append(row)
            sys.stderr.write("x" if row["model"] or row["extractive"] or row["agents"] else ".")
            sys.stderr.flush()
            if show and (row["model"] or row["extractive"]) and show > 0:
                show -= 1
                print(
                    f"\n#{v.index} {v.language}/{v.disguise}: {v.text!r}\n  model: {answered!r}"
                    f"\n  extractive: {quoted[:400]!r}"
                )
    sys.stderr.write("\n")
    return {"variants": len(rows), "rows": rows}


FP_FILES = ("neurips_2023_2025.jsonl.gz", "icml2026_main.jsonl.gz", "icml2026_workshops.jsonl.gz")


def _abstracts(name: str, limit: int | None = None) -> Iterator[str]:
    """The abstracts of `../shared/data/NAME`, the first `limit` of them when given."""
    import gzip

    from bench.helpers import SHARED_DATA

    with gzip.open(SHARED_DATA / name, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if limit and n >= limit:
                return
            yield json.loads(line).get("abstract") or ""


def false_positives(
    limit: int | None = None, probe_too: bool = True, vectors: Path | None = None
) -> dict:
    """Per file: sentences, and those flagged by the rules alone and with the probe (examples);
    without `probe_too`, by the rules and word list only (no embedding: a minute). `vectors`: an
    .npz of the probe's sentence vectors, read if it exists and written after (every abstract of
    the three files is over an hour of embedding on two cores; a retrained probe then reads them
    in minutes)."""

    import numpy as np

    from rag.answer.citations import split_sentences
    from rag.answer.injection import (
        PROBE_MODEL,
        instruction_sentences,
        probe_embed,
        probe_levels,
        probe_scores,
        risky_tokens,
    )
    from rag.backends.embedders import make_embedder
    from rag.config import Settings

    embed = probe_embed(make_embedder(Settings(embed_model=PROBE_MODEL))) if probe_too else None
    memo: dict[str, Any] = {}
    if vectors is not None and vectors.exists():
        cached = np.load(vectors)
        memo.update(zip(cached["texts"].tolist(), cached["vectors"]))

    def probe(texts: list[str]) -> list[Any]:
        new = [t for t in dict.fromkeys(texts) if t not in memo]
        if new and embed is not None:
            memo.update(zip(new, np.asarray(embed(new), dtype=np.float32)))
        return [memo[t] for t in texts]

    content, threshold = probe_levels()
    out = {}
    for name in FP_FILES:
        total = by_rules = with_probe = over = payload = 0
        examples: list[str] = []
        for abstract in _abstracts(name, limit):
            rules = instruction_sentences(abstract)
            both = instruction_sentences(abstract, embed=probe) if probe_too else rules
            total += len(rules)
            by_rules += sum(rules)
            with_probe += sum(both)
            unread = [s for s, f in zip(split_sentences(abstract), rules) if not f]
            for s, score in zip(unread, probe_scores(unread, probe) if probe_too else []):
                over += score > threshold
                payload += content <= score <= threshold and bool(risky_tokens(s))
            examples += [s for s, f in zip(split_sentences(abstract), both) if f]
        out[name] = {
            "sentences": total,
            "rules": by_rules,
            "rules_and_probe": with_probe,
            "probe_over_threshold": over,
            "probe_payload_not_prose": payload,
            "examples": examples[:40],
        }
        print(
            f"{name}: {total:,} sentences; flagged by the rules and word list {by_rules}"
            f" ({1e4 * by_rules / max(total, 1):.2f} per 10k), with the word list and probe"
            f" {with_probe} ({1e4 * with_probe / max(total, 1):.2f} per 10k; the probe's threshold"
            f" {over}, a code or link in a sentence not read as prose {payload})",
            flush=True,
        )
    if vectors is not None and memo:
        np.savez(vectors, texts=np.array(list(memo)), vectors=np.stack(list(memo.values())))
    return out


def overruled() -> dict:
    """Per file, the rules' flags on every abstract and how many stand once the probe has read the
    abstracts they fall in (it overrules a word rule on payload-free prose): a few minutes, as
    only those abstracts are embedded."""

    from rag.answer.citations import split_sentences
    from rag.answer.injection import PROBE_MODEL, instruction_sentences, probe_embed
    from rag.backends.embedders import make_embedder
    from rag.config import Settings

    embed = probe_embed(make_embedder(Settings(embed_model=PROBE_MODEL)))
    out = {}
    for name in FP_FILES:
        total, flagged, standing = 0, [], []
        for abstract in _abstracts(name):
            rules = instruction_sentences(abstract)
            total += len(rules)
            if any(rules):
                probe = instruction_sentences(abstract, embed=embed)
                sentences = split_sentences(abstract)
                flagged += [s for s, r in zip(sentences, rules) if r]
                standing += [s for s, r, p in zip(sentences, rules, probe) if r and p]
        out[name] = {"sentences": total, "rules": flagged, "standing": standing}
        print(
            f"{name}: {total:,} sentences; the rules flag {len(flagged)}, {len(standing)} stand"
            f" with the probe ({1e4 * len(standing) / max(total, 1):.2f} per 10k)",
            flush=True,
        )
    return out


def payload_free() -> dict:
    """The 40 orders of tests/data/injection_payload_free_wordings.json (no code or link: they
    change what an answer says; written blind to the defence) in an English abstract: how many
    the rules and word list flag alone, and with the probe (which may also overrule a rule)."""
    from rag.answer.injection import PROBE_MODEL, instruction_sentences, probe_embed
    from rag.backends.embedders import make_embedder
    from rag.config import Settings

    embed = probe_embed(make_embedder(Settings(embed_model=PROBE_MODEL)))
    rows = []
    for wording in json.loads(PAYLOAD_FREE.read_text("utf-8")):
        text = f"{CONTEXT} {wording['text'].replace('{T}', 'sparse expert routing')}"
        rules, probe = (any(instruction_sentences(text, embed=e)[2:]) for e in (None, embed))
        rows.append({**wording, "rules": rules, "rules_and_probe": probe})
    for kind in ("en", "other"):
        part = [r for r in rows if (r["kind"] == "en") == (kind == "en")]
        rules, both = (sum(r[k] for r in part) for k in ("rules", "rules_and_probe"))
        print(
            f"{kind}: {len(part)} orders; flagged by the rules and word list {rules},"
            f" with the probe {both}"
        )
    return {"rows": rows}


def report(result: dict) -> None:
    rows = result["rows"]
    for name in HALVES:
        part = [r for r in rows if r.get("half", "held out" if r["held_out"] else "tuned") == name]
        if not part:
            continue
        print(
            f"{name:9s} ({len(part)}): "
            + ", ".join(f"{s} {sum(r[s] for r in part)}" for s in SURFACES)
        )
    wordings = WORDINGS + FRESH_WORDINGS
    for key, names in (("disguise", DISGUISES), ("wording", range(len(wordings)))):
        counts = {s: Counter(r[key] for r in rows if r[s]) for s in SURFACES[:4]}
        print(
            f"by {key}: "
            + "; ".join(
                f"{n if key == 'disguise' else f'{n}:{wordings[n][0]}'} "
                + "/".join(str(counts[s][n]) for s in SURFACES[:4])
                for n in names
                if key == "disguise" or n < len(WORDINGS) or any(r["wording"] == n for r in rows)
            )
            + "  (model/voice/extractive/agents)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--show", type=int, default=0, help="print the first N leaking answers")
    ap.add_argument("--fresh", action="store_true", help="the never-tuned wordings too")
    ap.add_argument("--false-positives", action="store_true")
    ap.add_argument("--limit", type=int, help="abstracts per file (false positives)")
    ap.add_argument("--vectors", type=Path, help="cache of the probe's vectors (false positives)")
    ap.add_argument("--rules-only", action="store_true", help="false positives without the probe")
    ap.add_argument("--payload-free", action="store_true", help="orders without a code or link")
    ap.add_argument("--overruled", action="store_true", help="the rules' flags the probe overrules")
    args = ap.parse_args()
    if args.payload_free:
        result = payload_free()
    elif args.overruled:
        result = overruled()
    elif args.false_positives:
        result = false_positives(args.limit, not args.rules_only, args.vectors)
    else:
        result = run(args.show, args.fresh)
        report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
