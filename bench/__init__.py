"""The project's benchmarks, grouped by what they measure: `baseline`, `retrieval`, `answers`,
`speed` (speed and scale), `serving`, and `studies` (finished, kept runnable, not maintained). Each
module is a script, run from the repository root as `python -m bench.GROUP.NAME`; bench/README.md is
the index.

Shared code lives in `bench/helpers.py` (percentile, repository paths, machine load, JSON results),
`bench/retrieval/common.py` (the retrieval comparisons' candidates, fusions and hit@k) and
`tests/harness.py` (processes and servers, shared with the tests). Not part of the installed
package.
"""
