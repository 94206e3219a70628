"""The NATS-direct client against the running stack: the vectors and rankings the HTTP routes answer,
and their errors, without the gateway."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.fleet_client import FleetClient
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


def _with_client(stack, work):
    async def run():
        async with await FleetClient.connect(stack.nats_url) as fleet:
            return await work(fleet)

    return asyncio.run(run())


def test_vectors_equal_the_http_routes_and_the_reference(stack, reference):
    texts = mixed_texts(40)
    direct = _with_client(stack, lambda fleet: fleet.embed(texts, MODEL))
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    http = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    assert direct.shape == (40, 384) and direct.dtype == np.float32
    np.testing.assert_allclose(direct, http, atol=1e-6)
    assert cosines(direct, reference.encode(texts)).min() > 1 - COSINE_TOLERANCE


def test_one_string_the_only_model_and_options(stack, reference):
    async def work(fleet):
        one = await fleet.embed("how do I reset my password?")  # the only model served
        short = await fleet.embed(["how do I reset my password?"], MODEL, dimensions=64)
        return one, short, await fleet.models()

    one, short, models = _with_client(stack, work)
    assert models == [MODEL] and one.shape == (1, 384)
    assert short.shape == (1, 64)
    np.testing.assert_allclose(short[0], one[0, :64] / np.linalg.norm(one[0, :64]), atol=1e-5)


def test_rankings_equal_the_rerank_route(stack):
    docs = ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris."]
    query = "What is the capital of France?"
    ranked = _with_client(stack, lambda fleet: fleet.rerank(query, docs, MODEL, top_n=2))
    r = httpx.post(f"{stack.base_url}/rerank", json={"query": query, "texts": docs}, timeout=60)
    assert r.status_code == 200, r.text
    http = [(x["index"], x["score"]) for x in r.json()][:2]
    assert [i for i, _ in ranked] == [i for i, _ in http]
    np.testing.assert_allclose([s for _, s in ranked], [s for _, s in http], atol=1e-6)


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda fleet: fleet.embed(["x"], "no-such-model"), ErrorCode.MODEL_NOT_FOUND),
        (lambda fleet: fleet.embed([]), ErrorCode.INVALID_REQUEST),
        (lambda fleet: fleet.embed(["fine", ""]), ErrorCode.INVALID_REQUEST),
        (lambda fleet: fleet.embed(["x"], dimensions=0), ErrorCode.INVALID_REQUEST),
        (lambda fleet: fleet.embed(["x"], dimensions=385), ErrorCode.INVALID_REQUEST),
        (lambda fleet: fleet.embed(["x"], prompt_name="nope"), ErrorCode.INVALID_REQUEST),
        (lambda fleet: fleet.rerank("q", ["d"], top_n=0), ErrorCode.INVALID_REQUEST),
    ],
    ids=["unknown-model", "no-texts", "empty-text", "dimensions-0", "dimensions-over", "unknown-prompt", "top-n-0"],
)
def test_bad_requests_raise_the_error_http_answers(stack, call, code):
    with pytest.raises(ServiceError) as raised:
        _with_client(stack, call)
    assert raised.value.code is code, raised.value


def test_an_input_too_long_names_its_row(stack):
    texts = ["short", "word " * 600]
    with pytest.raises(ServiceError) as raised:
        _with_client(stack, lambda fleet: fleet.embed(texts, truncate=False))
    assert raised.value.code is ErrorCode.INPUT_TOO_LONG and raised.value.row == 1
    assert str(raised.value).startswith("input 1 has ")


def test_an_unreachable_nats_is_named():
    with pytest.raises(ConfigError, match=r"nats://127.0.0.1:1"):
        asyncio.run(FleetClient.connect("nats://127.0.0.1:1"))


def test_the_docs_example_runs_as_written_against_the_local_stack(stack, tmp_path):
    """docs/fleet-client.md's example, typed as it stands, in a folder where `up` recorded the stack (here the
    suite's stack, recorded the same way)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from embedfleet.shared.nats.local_stack import LocalStack

    page = (Path(__file__).parents[2] / "docs" / "fleet-client.md").read_text()
    section = page.split("# From Python, over NATS", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    LocalStack(stack.nats_url, None, os.getpid()).write(tmp_path / ".embedfleet")
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    for name in ("EMBEDFLEET_NATS_URL", "NATS_URL"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "384)", "float32", "(1,", "64)", "1"], done.stdout
