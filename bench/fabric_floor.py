"""The floors of ``bench.fabric``: what serving HTTP and tokenizing cost before any of the stack's work.

HTTP: a bare starlette app on uvicorn with the gateway's server stack (httptools, uvloop when
installed), one POST route answering what an OpenAI embeddings answer looks like with one 384-float
vector, as its own process (``http_floor`` starts it):

    python -m bench.fabric_floor --port PORT

Tokenizing: HF tokenizers' ``encode_batch`` in this process (``tokenizer_floor``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.fabric_load import self_seconds
from embedfleet.shared.nats.server import free_port

DIM = 384  # all-MiniLM-L6-v2's width: the answer a real model's request gets


def create_app() -> Starlette:
    vector = np.random.default_rng(0).standard_normal(DIM, dtype=np.float32)

    async def embeddings(request: Request) -> Response:
        body = orjson.loads(await request.body())
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(texts))]
        answer = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }
        return Response(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


@contextmanager
def http_floor(log: Path, timeout: float = 60) -> Iterator[tuple[str, int]]:
    """``bench.fabric_floor`` as a process; yields its embeddings URL and pid once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fabric_floor", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + timeout
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP floor did not start (exit {proc.poll()}):\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, json={"model": "floor", "input": "ping"}, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def tokenizer_floor(folder: Path, texts: list[str], per_call: int, seconds: float) -> dict:
    """HF tokenizers' ``encode_batch`` in this process, truncation at the model's limit, no padding,
    ``per_call`` texts a call: of ``texts`` as they are ("whole"), and of each cut after its last kept
    token (the floor: a text past the limit costs its kept tokens, not its length, as the tokenizer
    service cuts it first). CPU includes the library's own threads."""
    from tokenizers import Tokenizer

    from embedfleet.shared.model_dir.load import load_model_info

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(load_model_info(str(folder)).max_seq_length)
    tokenizer.no_padding()
    kept = []
    for text, e in zip(texts, tokenizer.encode_batch(texts)):
        ends = [end for (_, end), special in zip(e.offsets, e.special_tokens_mask) if not special]
        kept.append(text[: max(ends)] if ends else text)
    whole = _encode_for(tokenizer, texts, per_call, seconds / 2)
    return {
        **_encode_for(tokenizer, kept, per_call, seconds / 2),
        "whole_texts_cpu_ms_per_1k_tokens": whole["cpu_ms_per_1k_tokens"],
    }


def _encode_for(tokenizer, texts: list[str], per_call: int, seconds: float) -> dict:
    """Every text of ``texts``, ``per_call`` a call, over and over for about ``seconds`` (once at least)."""
    tokenizer.encode_batch(texts[:per_call])  # warm-up
    tokens, calls = 0, 0
    used, start = self_seconds(), time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        for i in range(0, len(texts), per_call):
            tokens += sum(len(e.ids) for e in tokenizer.encode_batch(texts[i : i + per_call]))
        calls += 1
    cpu = self_seconds() - used
    return {
        "tokens": tokens,
        "cpu_s": cpu,
        "seconds": time.perf_counter() - start,
        "cpu_ms_per_1k_tokens": cpu * 1e3 / tokens * 1e3,
    }


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # the gateway's stack: uvicorn's httptools protocol (its own subclass adds limits), loop "auto" (uvloop)
    uvicorn.run(
        create_app(),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="auto",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
