"""The HTTP floor of ``bench.fabric``: a bare starlette app on uvicorn with the gateway's server stack
(httptools, uvloop when installed), one POST route answering what an OpenAI embeddings answer looks
like with one 384-float vector. What serving HTTP costs before any embedding work.

    python -m bench.fabric_floor --port PORT
"""

from __future__ import annotations

import argparse

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DIM = 384  # all-MiniLM-L6-v2's width: the answer a real model's request gets


def create_app() -> Starlette:
    vector = np.random.default_rng(0).standard_normal(DIM, dtype=np.float32)

    async def embeddings(request: Request) -> Response:
        body = orjson.loads(await request.body())
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(texts))]
        answer = {"object": "list", "data": data, "model": body.get("model"),
                  "usage": {"prompt_tokens": 0, "total_tokens": 0}}
        return Response(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # the gateway's stack: uvicorn's httptools protocol (its own subclass adds limits), loop "auto" (uvloop)
    uvicorn.run(create_app(), host="127.0.0.1", port=args.port, http="httptools", loop="auto", log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
