"""The few exception types the project raises. Each message names the fix.

The CLI turns any `RagError` into one line on stderr and exit code 1.
"""

from __future__ import annotations


class RagError(Exception):
    """Base class: a user or runtime problem with a message that says how to fix it."""


class InputError(RagError):
    """A bad question, option or argument (empty question, k < 1, unknown mode...)."""


class CorpusError(RagError):
    """A corpus file that cannot be read or parsed; nothing from that file was written."""


class StoreError(RagError):
    """The index cannot be used as it is (other embedding model, old schema, locked, unwritable)."""


class LLMError(RagError):
    """The configured LLM endpoint failed (unreachable, 401, unknown model...)."""
