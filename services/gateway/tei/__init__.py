"""text-embeddings-inference's API: /embed, /embed_sparse, /embed_all, /tokenize, /info (api.py, body.py,
answers.py) and its task routes /predict, /similarity, /decode, /rerank and POST / (tasks.py, task_bodies.py);
the routes' work through the fleet: the embedding routes', /tokenize's and /info's (serving.py), the task
routes' (task_serving.py), each typed against core.py's ``Embedder``."""
