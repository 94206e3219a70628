"""text-embeddings-inference's API: /embed, /embed_sparse, /embed_all, /tokenize, /info (api.py, body.py,
answers.py) and its task routes /predict, /similarity, /decode, /rerank and POST / (tasks.py, task_bodies.py);
the embedding routes' work through the fleet (serving.py)."""
