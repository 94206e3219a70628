"""OpenAI's API: POST /v1/embeddings (and /embeddings) and GET /v1/models — the route handlers (api.py), the typed
request body (body.py), the typed answers (answers.py), and the model list (models.py)."""
