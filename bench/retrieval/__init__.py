"""Ranking quality: fusions and stemmers, embedders, ranking diffs between checkouts, a Chroma
server's BM25."""
