"""Serving: the HTTP API, the browser chat under load, replicas on a Chroma server, hostile
clients."""
