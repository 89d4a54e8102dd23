"""`python -m rag` is the `rag` command."""

from rag.cli import main

raise SystemExit(main())
