"""HTTP gateway (starlette + uvicorn): OpenAI-compatible API in front of the NATS fleet.

A package per API family (openai/, tei/, cohere/, rerank/, search/, jobs/), each with its requests' shapes
(api.py), typed bodies (body.py), typed answers (answers.py) and work through the fleet (serving.py); http/
holds what every route shares below them; the gateway's core stays here: the route table (routes.py), the
application (app.py; a thin method a route), the interfaces the families use (core.py), config, metrics and /openapi.json."""
