"""Serving: the OpenAI-compatible HTTP API (`http`, with `gate` and `openai_shapes`) and the MCP
server (`mcp`) over one engine, with the argument checks both share (`requests`).

Nothing is re-exported here, so that `import rag.serve` loads neither starlette (the `serve` extra)
nor the mcp SDK (the `mcp` extra).
"""
