"""Cohere's API as its SDK calls it: POST /v1/embed, /v2/embed and /v2/rerank — the routes' shapes (api.py), their
typed request bodies (body.py) and typed answers (answers.py)."""
