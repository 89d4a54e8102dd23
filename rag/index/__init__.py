"""The write path: read a corpus, chunk it, embed it, and keep the store (manifest, vectors, keyword
index) whole."""
