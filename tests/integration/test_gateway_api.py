"""The gateway's APIs on the real stack: OpenAI extras, TEI routes, binary answers, limits, errors."""

from __future__ import annotations

import hashlib
import threading

import httpx
import msgpack
import numpy as np
import openai
import pytest

from embedfleet.services.gateway.tei.answers import TeiInfo, TeiTokenizeAnswer
from embedfleet.shared.observability.tracing import TraceContext
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import another_gateway, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(24)


@pytest.fixture(scope="module")
def expected(reference, texts) -> np.ndarray:
    return reference.encode(texts)


def _close(got, want) -> None:
    c = cosines(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert c.min() >= COSINE_TOLERANCE, c.min()


def test_openai_client_with_token_ids(stack, reference, texts, expected):
    ids = reference.tokenizer(texts[:4], truncation=True, max_length=256)["input_ids"]
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    many = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    _close([d.embedding for d in many.data], expected[:4])
    assert many.usage.prompt_tokens == sum(len(i) for i in ids)
    one = client.embeddings.create(model=MODEL, input=ids[0])  # base64
    _close([one.data[0].embedding], expected[:1])


def test_input_type_and_user_are_accepted(stack, texts, expected):
    r = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        json={"model": MODEL, "input": texts[:3], "input_type": "query", "user": "u-1"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    _close([d["embedding"] for d in r.json()["data"]], expected[:3])  # this model has no query prompt


def test_out_of_vocabulary_token_ids_are_refused(stack):
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": [[101, 999999, 102]]}, timeout=30)
    assert r.status_code == 422, r.text
    assert "outside the vocabulary" in r.json()["error"]["message"]


def test_an_inputs_error_names_its_row_in_the_request(stack):
    r = httpx.post(
        f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": [[101, 102], [101, 999999, 102]]}, timeout=30
    )
    assert r.status_code == 422, r.text
    assert r.json() == {
        "error": {
            "message": "input 1 has token ids outside the vocabulary [0, 30522)",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_tokens",
        }
    }


def test_tei_embed(stack, texts, expected):
    r = httpx.post(f"{stack.base_url}/embed", json={"inputs": texts[:5], "truncate": True}, timeout=30)
    assert r.status_code == 200, r.text
    _close(r.json(), expected[:5])
    for header in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time", "x-request-id"):
        assert header in r.headers
    raw = httpx.post(
        f"{stack.base_url}/embed", json={"inputs": texts[0], "normalize": False, "truncate": True}, timeout=30
    )
    assert abs(np.linalg.norm(raw.json()[0]) - 1) > 0.05


def test_tei_refuses_long_input_unless_truncating(stack, reference):
    long_text = "the quick brown fox " * 200
    r = httpx.post(f"{stack.base_url}/embed", json={"inputs": long_text}, timeout=30)
    assert r.status_code == 413
    assert r.json()["error_type"] == "Validation" and "limit is 256" in r.json()["error"]
    # left truncation keeps the end of the input: the same as sending its last tokens
    ids = reference.tokenizer(long_text + " jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    left = httpx.post(
        f"{stack.base_url}/embed",
        json={"inputs": long_text + " jumps over the lazy dog", "truncate": True, "truncation_direction": "Left"},
        timeout=30,
    )
    tail = httpx.post(
        f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": [101, *ids[-254:], 102]}, timeout=30
    )
    assert left.status_code == 200 and tail.status_code == 200
    _close(left.json(), [tail.json()["data"][0]["embedding"]])


def test_tei_unknown_prompt_name(stack):
    r = httpx.post(f"{stack.base_url}/embed", json={"inputs": "x", "prompt_name": "query"}, timeout=30)
    assert r.status_code == 400 and "has no prompt 'query'" in r.json()["error"]


def test_tei_tokenize(stack, reference):
    text = "Hello, embedfleet!"
    r = httpx.post(f"{stack.base_url}/tokenize", json={"inputs": [text]}, timeout=30)
    assert r.status_code == 200, r.text
    TeiTokenizeAnswer.model_validate_json(r.content)  # of a live tokenizer's answer: strictly its model
    (tokens,) = r.json()
    assert [t["id"] for t in tokens] == reference.tokenizer(text)["input_ids"]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[1]["text"] == "Hello" and (tokens[1]["start"], tokens[1]["stop"]) == (0, 5)
    bare = httpx.post(
        f"{stack.base_url}/tokenize", json={"inputs": text, "add_special_tokens": False}, timeout=30
    ).json()
    assert not any(t["special"] for t in bare[0])


def test_tei_info(stack):
    answer = httpx.get(f"{stack.base_url}/info")
    TeiInfo.model_validate_json(answer.content)  # of a live registration's metadata: strictly its model
    info = answer.json()
    assert info["model_id"] == MODEL and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_batch_tokens"] == 2048


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embed"])
def test_binary_answers_equal_json(stack, texts, path):
    body = {"model": MODEL, "input": texts[:6]} if path == "/v1/embeddings" else {"inputs": texts[:6], "truncate": True}
    as_json = httpx.post(f"{stack.base_url}{path}", json=body, timeout=30).json()
    rows = np.array([d["embedding"] for d in as_json["data"]] if path == "/v1/embeddings" else as_json, np.float32)
    octet = httpx.post(f"{stack.base_url}{path}", json=body, headers={"accept": "application/octet-stream"}, timeout=30)
    assert octet.headers["content-type"] == "application/octet-stream"
    shape = (int(octet.headers["x-embedding-rows"]), int(octet.headers["x-embedding-dim"]))
    np.testing.assert_allclose(np.frombuffer(octet.content, "<f4").reshape(shape), rows, atol=1e-6)
    packed = httpx.post(f"{stack.base_url}{path}", json=body, headers={"accept": "application/msgpack"}, timeout=30)
    m = msgpack.unpackb(packed.content)
    np.testing.assert_allclose(np.frombuffer(m["data"], "<f4").reshape(m["rows"], m["dim"]), rows, atol=1e-6)


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({"model": MODEL, "input": ["a"] * 2049}, 422, "the limit is 2048"),
        ({"model": MODEL, "input": "x" * 70000}, 413, "the limit is 65536"),
    ],
)
def test_limits(stack, body, status, fragment):
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == status and fragment in r.json()["error"]["message"]


def test_body_size_limit(stack):
    r = httpx.post(f"{stack.base_url}/v1/embeddings", content=b"x" * (9 << 20), timeout=30)
    assert r.status_code == 413 and "byte limit" in r.json()["error"]["message"]


def test_request_ids(stack):
    given = httpx.get(f"{stack.base_url}/v1/models", headers={"x-request-id": "trace-123"})
    assert given.headers["x-request-id"] == "trace-123"
    fresh = httpx.get(f"{stack.base_url}/v1/models", headers={"x-request-id": "bad id with spaces"})
    assert len(fresh.headers["x-request-id"]) == 32
    assert httpx.get(f"{stack.base_url}/nothing").headers["x-request-id"]


def test_every_answer_carries_the_trace_context(stack):
    """Without an OTLP endpoint nothing is recorded, yet the client's trace continues: the answer names
    the same trace, under the gateway's own span id, with the client's sampled flag."""
    client = TraceContext.start(sampled=True)
    r = httpx.post(
        f"{stack.base_url}/embed", json={"inputs": "traced"}, headers={"traceparent": client.header}, timeout=30
    )
    answered = TraceContext.parse(r.headers["traceparent"])
    assert r.status_code == 200 and answered.trace_id == client.trace_id and answered.span_id != client.span_id
    assert answered.sampled
    failed = httpx.post(f"{stack.base_url}/embed", json={}, headers={"traceparent": client.header}, timeout=30)
    assert failed.status_code == 400 and TraceContext.parse(failed.headers["traceparent"]).trace_id == client.trace_id
    for bad in ("", "00-zz-11-01", f"00-{'0' * 32}-{'1' * 16}-01"):  # missing or malformed: a new trace
        fresh = TraceContext.parse(
            httpx.get(f"{stack.base_url}/health", headers={"traceparent": bad}).headers["traceparent"]
        )
        assert fresh is not None and fresh.trace_id != client.trace_id


def test_metrics(stack, texts):
    httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": texts[:2]}, timeout=30)
    httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL}, timeout=30)
    text = httpx.get(f"{stack.base_url}/metrics").text
    assert 'embedfleet_requests_total{code="200",route="/v1/embeddings"}' in text
    assert 'embedfleet_errors_total{code="400",route="/v1/embeddings"}' in text
    assert 'embedfleet_tokens_total{model="all-MiniLM-L6-v2"}' in text
    for stage in ("queue", "tokenize", "inference", "total"):
        assert f'embedfleet_stage_seconds_count{{stage="{stage}"}}' in text
    assert "embedfleet_requests_in_flight" in text


def test_openapi_lists_the_real_routes(stack):
    spec = httpx.get(f"{stack.base_url}/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert set(spec["paths"]) == {
        "/v1/embeddings",
        "/embeddings",
        "/v1/models",
        "/embed",
        "/embed_sparse",
        "/embed_all",
        "/tokenize",
        "/info",
        "/predict",
        "/similarity",
        "/decode",
        "/",
        "/invocations",
        "/ping",
        "/v1/embed",
        "/v2/embed",
        "/v2/rerank",
        "/health",
        "/metrics",
        "/openapi.json",
        "/v1/jobs",
        "/v1/jobs/{job}",
        "/v1/jobs/{job}/results",
        "/rerank",
        "/v1/rerank",
        "/v1/search",
    }
    assert set(spec["paths"]["/v1/jobs/{job}"]) == {"get", "delete"}  # a job's state; cancelling it
    results = spec["paths"]["/v1/jobs/{job}/results"]["get"]  # a finished job's vectors, in two forms
    assert set(results["responses"]["200"]["content"]) == {"application/x-ndjson", "application/vnd.apache.parquet"}
    assert {"404", "406", "409", "410"} <= set(results["responses"])


@pytest.fixture(scope="module")
def strict_gateway(stack, tmp_path_factory):
    """A second gateway on the same fleet: API keys, one request at a time, a short deadline."""
    folder = tmp_path_factory.mktemp("strict")
    (folder / "keys").write_text("# keys\nkey-one\nkey-two\n")
    yield from another_gateway(
        stack.nats_url,
        ["--api-keys-file", str(folder / "keys"), "--max-in-flight", "1", "--request-timeout", "1.5"],
        folder,
    )


def test_api_keys(strict_gateway):
    body = {"model": MODEL, "input": "hi"}
    missing = httpx.post(f"{strict_gateway}/v1/embeddings", json=body, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.post(f"{strict_gateway}/embed", json={"inputs": "hi"}, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error_type"] == "Unauthorized"
    ok = httpx.post(
        f"{strict_gateway}/v1/embeddings", json=body, headers={"authorization": "Bearer key-two"}, timeout=30
    )
    assert ok.status_code == 200
    assert httpx.get(f"{strict_gateway}/health").status_code == 200  # left open
    assert httpx.get(f"{strict_gateway}/metrics").status_code == 200


def test_overload_429_and_deadline_504(strict_gateway):
    auth = {"authorization": "Bearer key-one"}
    big = {"model": MODEL, "input": mixed_texts(600)}
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "r", httpx.post(f"{strict_gateway}/v1/embeddings", json=big, headers=auth, timeout=60)
        )
    )
    thread.start()
    wait_until(
        lambda: (
            "embedfleet_requests_in_flight 1.0" in httpx.get(f"{strict_gateway}/metrics").text or not thread.is_alive()
        ),
        10,
        "the big request in flight",
    )
    busy = httpx.post(f"{strict_gateway}/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=auth, timeout=30)
    thread.join(60)
    assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
    late = result["r"]
    assert late.status_code == 504, late.text
    assert "no complete result within 1.5s" in late.json()["error"]["message"]


@pytest.fixture(scope="module")
def limited_gateway(stack, tmp_path_factory):
    """A gateway on the same fleet whose keys may each make 3 requests and embed 60 tokens a minute, the
    keys' ids in its metrics made with a secret this test knows."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBEDFLEET_KEY_ID_SECRET", KEY_ID_SECRET)
        yield from another_gateway(
            stack.nats_url,
            ["--api-keys", "key-a,key-b,key-c", "--key-requests-per-minute", "3", "--key-tokens-per-minute", "60"],
            tmp_path_factory.mktemp("limited"),
        )


KEY_ID_SECRET = "metrics-key-id-secret"


def test_per_key_limits_answer_429_with_retry_after_and_show_in_the_metrics(limited_gateway):
    from embedfleet.services.gateway.metrics import key_id as salted
    from tests.support.prometheus_text import value

    def key_id(key: str) -> str:
        return salted(key, KEY_ID_SECRET.encode())

    def post(key: str, text: str = "hi") -> httpx.Response:
        return httpx.post(
            f"{limited_gateway}/v1/embeddings",
            json={"model": MODEL, "input": text},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )

    answers = [post("key-a") for _ in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 200, 429], [r.text for r in answers]
    refused = answers[-1]
    assert (
        refused.json()["error"]["code"] == "overloaded" and "3 requests a minute" in refused.json()["error"]["message"]
    )
    assert 1 <= int(refused.headers["retry-after"]) <= 20  # one request's worth of refill: 20 s
    assert post("key-b").status_code == 200  # each key has its own limits
    # tokens: a request over the minute's 60 tokens is answered (its size is known only then), the next waits
    long_text = " ".join(mixed_texts(6))
    first = post("key-c", long_text)
    assert first.status_code == 200 and first.json()["usage"]["prompt_tokens"] > 60
    after = post("key-c")
    assert after.status_code == 429 and "60 tokens a minute" in after.json()["error"]["message"]
    assert int(after.headers["retry-after"]) >= 1
    metrics = httpx.get(f"{limited_gateway}/metrics").text
    assert value(metrics, "embedfleet_key_requests_total", key=key_id("key-a"), outcome="admitted") == 3
    assert value(metrics, "embedfleet_key_requests_total", key=key_id("key-a"), outcome="limited") == 1
    assert value(metrics, "embedfleet_key_tokens_total", key=key_id("key-c")) == first.json()["usage"]["prompt_tokens"]
    assert "key-a" not in metrics  # keys are named by their id, never shown
    assert hashlib.sha256(b"key-a").hexdigest()[:12] not in metrics  # nor by a plain digest, open to guesses
