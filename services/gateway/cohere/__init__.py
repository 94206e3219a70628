"""Cohere's API as its SDK calls it: POST /v1/embed, /v2/embed and /v2/rerank — the routes' shapes (api.py),
their work through the fleet (serving.py), typed request bodies (body.py) and typed answers (answers.py)."""
