"""Build rag/answer/rules/topic_terms.txt.gz, the list of topic words and phrases
(rag/answer/rules/topic.py), from older abstracts: a maintainer's step, run once; the product only
reads the list.

    pip install wordfreq==3.1.1   # everyday-English word frequencies (build time only)
    python scripts/build_topic_terms.py ../shared/data/neurips_2023_2025.jsonl.gz \
        ../shared/data/paperlists_1987_2025.jsonl.gz

A word is listed (as written, lowercased) when its stem is in 20 or more abstracts and at most 5% of
them, in the title of at least a fifth of the abstracts that use it, among the author keywords of at
least 30% of the papers with keywords (NeurIPS 2023-2025) that use it ("spiking" 70%, "forecasting"
59%; "spotting" 17%, "mixes" 14%), and the word itself is not everyday English (wordfreq Zipf
frequency at most 3.8: "spiking" 2.8, "chatbot" 2.3; "painfully" 4.1 is left out). A phrase (two
stems side by side) is listed when it is in 10 or more abstracts and at most 2%, and in the title of
at least two fifths of them. The thresholds were chosen on the tuning half of the question sets
(docs/answers.md).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

from rag.answer.rules.topic import TERMS_FILE, _stem, units, words

WORD_DF, WORD_SHARE, WORD_TITLE, WORD_ZIPF, WORD_KEYWORD = 20, 0.05, 0.2, 3.8, 0.3
PHRASE_DF, PHRASE_SHARE, PHRASE_TITLE = 10, 0.02, 0.4


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "files", nargs="+", type=Path, help="JSONL(.gz) files of papers with title and abstract"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "rag/answer/rules" / TERMS_FILE,
    )
    args = ap.parse_args()
    from wordfreq import zipf_frequency

    stem = _stem()
    n = 0
    df: collections.Counter[str] = collections.Counter()
    in_title: collections.Counter[str] = collections.Counter()
    written: collections.Counter[str] = collections.Counter()
    # of papers with author keywords: in their keywords
    keyed: collections.Counter[str] = collections.Counter()
    # of papers with author keywords: anywhere
    with_keywords: collections.Counter[str] = collections.Counter()
    for path in args.files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as lines:
            for line in lines:
                paper = json.loads(line)
                title, abstract = paper.get("title") or "", paper.get("abstract") or ""
                if len(title) + len(abstract) < 50:
                    continue
                n += 1
                title_words, title_phrases = units(title)
                body_words, body_phrases = units(abstract)
                title_units = title_words | {"_" + p for p in title_phrases}
                df.update(title_units | body_words | {"_" + p for p in body_phrases})
                in_title.update(title_units)
                keywords = paper.get("keywords")
                if keywords:
                    keyword_words, keyword_phrases = units(
                        keywords if isinstance(keywords, str) else " ; ".join(map(str, keywords))
                    )
                    keyed.update(keyword_words | {"_" + p for p in keyword_phrases})
                    with_keywords.update(title_units | body_words | {"_" + p for p in body_phrases})
                written.update(p for w in words(title + " " + abstract) for p in w)
    listed = []
    for word, count in written.items():
        s = stem(word)
        if (
            count >= 3
            and WORD_DF <= df[s] <= WORD_SHARE * n
            and in_title[s] >= WORD_TITLE * df[s]
            and zipf_frequency(word, "en") <= WORD_ZIPF
            and keyed[s] >= WORD_KEYWORD * with_keywords[s]
        ):
            listed.append(f"w {word}")
    for unit, count in df.items():
        if (
            unit.startswith("_")
            and PHRASE_DF <= count <= PHRASE_SHARE * n
            and in_title[unit] >= PHRASE_TITLE * count
        ):
            listed.append(f"p {unit[1:]}")
    listed.sort()
    args.out.write_bytes(gzip.compress(("\n".join(listed) + "\n").encode(), mtime=0))
    print(
        f"{n} abstracts: {sum(t[0] == 'w' for t in listed)} words,"
        f" {sum(t[0] == 'p' for t in listed)} phrases -> {args.out}"
        f" ({args.out.stat().st_size // 1024} KiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
