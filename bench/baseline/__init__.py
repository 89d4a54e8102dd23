"""Ours against the plain LlamaIndex quickstart: cold start, warm retrieval, index time, and answers
with citations."""
