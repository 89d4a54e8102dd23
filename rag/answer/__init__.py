"""Answering: pick the sources, ask the model, check every citation, and keep planted orders out."""
