"""Model runtimes: embedders, chat models (OpenAI-compatible or local llama.cpp) and their model
files."""
