"""Finished studies: each decided something that is recorded (its docstring's first line says what
and where the figures are). Kept runnable, not maintained; the finished studies whose results
sufficed were removed and are listed in bench/results/README.md with the commit where their script
last existed."""
