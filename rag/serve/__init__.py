"""Serving: the OpenAI-compatible HTTP API and the MCP server, over one engine.

- `http`: `rag serve`: the routes (chat completions, search, papers, models, health), the thread
  that feeds a streamed answer to the event loop, `make_app` and `serve` (starlette, uvicorn: the
  `serve` extra).
- `gate`: what a request passes before a route: the request head's size, the bearer key, the body
  size, the body as JSON and as a request model; `ApiError` and the mapping of engine errors to HTTP
  statuses.
- `openai_shapes`: the OpenAI request models, and an `Answer` as a chat completion or as stream
  chunks.
- `mcp`: the MCP tools (`search_papers`, `ask`, `get_paper`, `cite`) over stdio (`rag mcp`) and
  streamable HTTP (mounted at /mcp by `rag serve`) (the `mcp` extra).
- `requests`: the argument checks both surfaces share (k, mode, a question or query, paper ids) and
  their one-line messages; core only.

Nothing is re-exported here, so that `import rag.serve` loads neither starlette nor the mcp SDK.
"""
