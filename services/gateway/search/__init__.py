"""POST /v1/search: the route's work — embed the query, read the store, rerank on request (serving.py) — its shapes
(api.py), typed request body (body.py) and answer (answers.py), and the vector store it reads (store.py)."""
