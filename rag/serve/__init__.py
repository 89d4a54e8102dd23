"""Serving: the OpenAI-compatible HTTP API and the MCP server, over one engine."""
