"""OpenAI's API: POST /v1/embeddings (and /embeddings) and GET /v1/models — the request's shape and its
rendering (api.py), the route's work through the fleet (serving.py), the typed request body (body.py), the typed
answers (answers.py), and the model list (models.py)."""
