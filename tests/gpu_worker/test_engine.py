import numpy as np
import pytest
import torch

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.batch import DeviceBatch, prepare
from embedfleet.services.gpu_worker.engine.engine import CPU_SERIAL_MACS
from embedfleet.services.gpu_worker.engine.errors import EngineError, InputTooLong, InvalidTokens
from embedfleet.services.gpu_worker.engine.pooling import pool, postprocess
from embedfleet.services.gpu_worker.service import _CODES, wire_error
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions, TokenChunk
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts


@pytest.fixture(scope="module")
def engine(model_info) -> Engine:
    return Engine(model_info, device="cpu")


@pytest.fixture(scope="module")
def encoder(model_info) -> TextEncoder:
    return TextEncoder(model_info)


def _embed(engine, encoder, texts, max_tokens=4096):
    out = [
        engine.embed(chunk.input_ids, chunk.cu_seqlens) for chunk in pack_chunks(encoder.encode(texts), max_tokens, 256)
    ]
    return postprocess(np.concatenate(out), True, None, np.float32)


def test_matches_sentence_transformers(engine, encoder, reference):
    texts = mixed_texts(96)
    ours = _embed(engine, encoder, texts)
    ref = reference.encode(texts, batch_size=32)
    c = cosines(ours, ref)
    assert c.min() >= COSINE_TOLERANCE, f"worst cosine {c.min():.6f} at {c.argmin()}"


def test_packed_batch_equals_one_at_a_time(engine, encoder):
    texts = mixed_texts(12)
    packed = _embed(engine, encoder, texts)
    alone = np.concatenate([_embed(engine, encoder, [t]) for t in texts])
    np.testing.assert_allclose(packed, alone, atol=2e-5)


def test_pooling_modes():
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # 6 tokens, hidden 2
    batch = DeviceBatch(prepare(np.zeros(6, np.int32), np.array([0, 2, 6]), 0), torch.device("cpu"))
    assert pool(hidden, batch, "cls").tolist() == [[0, 1], [4, 5]]
    assert pool(hidden, batch, "lasttoken").tolist() == [[2, 3], [10, 11]]
    assert pool(hidden, batch, "mean").tolist() == [[1, 2], [7, 8]]
    assert pool(hidden, batch, "max").tolist() == [[2, 3], [10, 11]]
    with pytest.raises(ValueError):
        pool(hidden, batch, "attention")


def test_postprocess_matryoshka_then_normalise():
    v = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    out = postprocess(v, True, 2, np.dtype("<f2"))
    assert out.dtype == np.dtype("<f2") and out.shape == (1, 2)
    np.testing.assert_allclose(out.astype(np.float32), [[0.6, 0.8]], atol=1e-3)
    np.testing.assert_array_equal(postprocess(v, False, None, np.float32), v)


def test_check_rejects_out_of_vocabulary_and_over_long(engine):
    """The engine's own errors, naming the first row at fault (its index in the batch)."""
    with pytest.raises(InvalidTokens) as err:
        engine.check(np.array([101, 102, 101, 30522, 102], np.int32), np.array([0, 2, 5], np.int32))
    assert (err.value.row, err.value.message) == (1, "has token ids outside the vocabulary [0, 30522)")
    with pytest.raises(InvalidTokens) as err:
        engine.check(np.array([-1], np.int32), np.array([0, 1], np.int32))
    assert err.value.row == 0
    with pytest.raises(InputTooLong) as err:
        engine.check(np.ones(261, np.int32), np.array([0, 2, 4, 261], np.int32))
    assert (err.value.row, err.value.message) == (2, "has 257 tokens; the model's limit is 256")
    engine.check(np.ones(256, np.int32), np.array([0, 256], np.int32))


def test_the_worker_answers_engine_errors_as_the_requests_rows():
    """One mapping: an engine error's batch row is the request's row ``batch.start + row``, under the wire's code."""
    batch = TokenChunk(
        "r",
        "m",
        start=64,
        total=100,
        input_ids=np.ones(3, np.int32),
        cu_seqlens=np.array([0, 1, 3], np.int32),
        deadline=0.0,
        options=EmbedOptions(),
    )
    for error, code in (
        (InvalidTokens(1, "has token ids outside the vocabulary [0, 9)"), ErrorCode.INVALID_TOKENS),
        (InputTooLong(0, "has 300 tokens; the model's limit is 256"), ErrorCode.INPUT_TOO_LONG),
    ):
        wire = wire_error(error, batch)
        assert (wire.code, wire.row, wire.message) == (code, 64 + error.row, error.message)
        assert wire.text() == f"input {64 + error.row} {error.message}"
    assert set(_CODES) == set(EngineError.__subclasses__())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu(model_info, engine, encoder):
    texts = mixed_texts(64)
    gpu = Engine(model_info, device="cuda")
    c = cosines(_embed(gpu, encoder, texts), _embed(engine, encoder, texts))
    assert c.min() >= 0.999  # float16 on the GPU


def test_small_cpu_batches_run_on_one_thread_and_long_ones_on_all(model_info, encoder):
    """A batch whose widest GEMM is under CPU_SERIAL_MACS multiply-adds runs on one thread (a team's
    fork and join cost more than its work); longer ones on the engine's threads; same vectors either way."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = Engine(model_info, device="cpu")
        widest = engine.spec.hidden_size * engine.spec.intermediate_size
        short = engine._serial_tokens - 1
        assert 0 < short < CPU_SERIAL_MACS // widest + 1
        ids = np.arange(2000, 2000 + short, dtype=np.int32)
        cu = np.array([0, short], np.int32)
        serial = engine.embed(ids, cu)
        assert torch.get_num_threads() == 1
        long_texts = mixed_texts(4)
        chunk = next(iter(pack_chunks(encoder.encode(long_texts), 4096, 256)))
        assert int(chunk.cu_seqlens[-1]) >= engine._serial_tokens
        engine.embed(chunk.input_ids, chunk.cu_seqlens)
        assert torch.get_num_threads() == 2
        np.testing.assert_allclose(engine.embed(ids, cu), serial, atol=1e-6)
        assert engine.replicate()._threads == 2  # not the one a small batch left set
    finally:
        torch.set_num_threads(before)
