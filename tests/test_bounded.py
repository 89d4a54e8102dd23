"""No rule over untrusted text can be stalled: every function of bench/hardening/pathological.py's
table (the answer rules, the injection filter, sentence splitting, LaTeX) finishes on 100,000
characters of the patterns that made a backtracking regex quadratic (38 s for "[" x 100,000 in
`sanitize`, 108 s for a names question over one long hyphenated run). The bound asserted is loose
(a busy machine); the benchmark prints the figures (under a second each, idle)."""

from __future__ import annotations

import pytest

from bench.hardening.pathological import CASES, N, cpu

# The units that stalled a function before, and a few of their kin.
UNITS = ["a-", "[", "![", "<script ", "A ", " ", "(Ab ", "Ab1+", "  \n", "$1", "e.g. ", "[a]("]
BOUND_S = 5.0


@pytest.mark.parametrize("name", list(CASES()))
def test_a_function_is_bounded_on_pathological_text(name):
    fn = CASES()[name]
    slow = {
        unit: seconds
        for unit in UNITS
        if (seconds := cpu(fn, (unit * (N // len(unit) + 1))[:N])) > BOUND_S
    }
    assert not slow, f"{name} took {slow} CPU seconds on 100,000 characters"
