"""The client libraries people already use, unchanged, against the running stack: the openai SDK (sync
and async, base64 and float, dimensions), langchain-openai and llama-index. Each checks the vectors
against sentence-transformers on the same model (cosine >= COSINE_TOLERANCE), not only a status."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import COSINE_TOLERANCE, cosines

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "embedfleet serves embeddings over NATS",
    "Une phrase en français.",
    "a" * 3000,
]


@pytest.fixture(scope="module")
def expected(reference) -> np.ndarray:
    return reference.encode(TEXTS, convert_to_numpy=True)


def _close(got, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    assert cosines(got, want).min() >= COSINE_TOLERANCE


def test_openai_async_client(stack, expected):
    import openai

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
        # several requests at once, as an async application sends them
        answers = await asyncio.gather(*[client.embeddings.create(model=MODEL, input=TEXTS) for _ in range(4)])
        floats = await client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
        short = await client.embeddings.create(model=MODEL, input=TEXTS, dimensions=128, encoding_format="float")
        await client.close()
        return answers, floats, short

    answers, floats, short = asyncio.run(run())
    for answer in answers:  # the SDK's default: base64, decoded by the SDK
        _close([d.embedding for d in answer.data], expected)
    _close([d.embedding for d in floats.data], expected)
    # Matryoshka: the first 128 components, renormalised
    cut = expected[:, :128] / np.linalg.norm(expected[:, :128], axis=1, keepdims=True)
    _close([d.embedding for d in short.data], cut)
    assert floats.usage.prompt_tokens > len(TEXTS)


def test_langchain_openai(stack, expected):
    """check_embedding_ctx_length=False: by default langchain-openai tokenizes with tiktoken (OpenAI's
    vocabulary, fetched from the network) and sends those token IDs, which mean nothing to another model."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=f"{stack.base_url}/v1", api_key="unused", check_embedding_ctx_length=False, max_retries=0
    )
    _close(embeddings.embed_documents(TEXTS), expected)
    _close([embeddings.embed_query(TEXTS[0])], expected[:1])


def test_llama_index(stack, expected):
    from llama_index.embeddings.openai import OpenAIEmbedding

    # model_name: llama-index checks `model` against OpenAI's names; any name passes as model_name
    embedding = OpenAIEmbedding(model_name=MODEL, api_base=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    _close(embedding.get_text_embedding_batch(TEXTS), expected)
    _close([embedding.get_query_embedding(TEXTS[1])], expected[1:2])
