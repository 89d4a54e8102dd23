"""The Gradio chat UI: `build_app(rag)` and `launch(rag, host, port)`."""

from .app import build_app, launch

__all__ = ["build_app", "launch"]
