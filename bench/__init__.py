"""The project's benchmarks: each module is a script, run from the repository root as `python -m bench.NAME`.

Shared code lives in `bench/helpers.py` (percentile, repository paths, machine load, JSON results) and
`tests/harness.py` (processes and servers, shared with the tests). Not part of the installed package.
"""
