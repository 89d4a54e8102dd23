"""Retrieval: hybrid keyword + dense search over the store, and the LlamaIndex query engine."""
