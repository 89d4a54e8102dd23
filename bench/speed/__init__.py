"""Speed and scale: 76 to 100k abstracts, a query's stages, `rag ask` as a person waits for it, the
local model."""
