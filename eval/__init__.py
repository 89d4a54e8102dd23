"""The evaluation question sets and their checkers: run from the repository root as `python -m
eval.NAME`."""
