"""Reranking shared by TEI's POST /rerank, Cohere's and Jina's POST /v1/rerank, /v2/rerank and search: the call a
rerank request makes and its answers (api.py), the routes' work through the scorer (serving.py), a multi-vector
model's ranking by MaxSim in the gateway (late.py), and the Cohere-style typed request bodies (body.py)."""
