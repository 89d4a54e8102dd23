"""Writes icml2026_sample.jsonl.gz: the ICML 2026 main-track records the tests read, so the suite
runs from a clone with no `../shared` beside it.

The first 600 records in file order (tests take "the first N"), then every other record whose title
holds a LaTeX special character (all 69 math titles among them) and the first 10 records without an
id. Lines are copied unchanged. Run by hand from the repository root: python
tests/data/make_icml_sample.py ../shared/data/icml2026_main.jsonl.gz
"""

import gzip
import json
import re
import sys
from pathlib import Path

lines = gzip.open(sys.argv[1], "rt", encoding="utf-8").read().splitlines()
rows = [json.loads(line) for line in lines]
keep = set(range(600))
keep |= {i for i, r in enumerate(rows) if re.search(r"[&%$#_{}~^\\]", r["title"])}
keep |= set([i for i, r in enumerate(rows) if not r["id"]][:10])
out = Path(__file__).with_name("icml2026_sample.jsonl.gz")
with gzip.GzipFile(out, "wb", mtime=0) as fh:  # mtime 0: the same input gives the same bytes
    fh.write("".join(lines[i] + "\n" for i in sorted(keep)).encode("utf-8"))
print(f"wrote {out}: {len(keep)} of {len(rows)} records")
