"""CUDA-graph machinery on CPU: buckets, padding, static buffers and lazy capture, with the one
CUDA-only call (the capture) replaced by a function that replays the static forward eagerly."""

import numpy as np
import pytest
import torch

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.batch import prepare
from embedfleet.services.gpu_worker.engine.graphs import GraphCache, bucket_sizes
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from tests.support.corpus import mixed_texts


def test_bucket_sizes():
    sizes = bucket_sizes(2048)
    assert sizes[:3] == [64, 128, 192]
    assert sizes[15] == 1024 and sizes[16] == 1280
    assert sizes[-1] == 2048
    assert bucket_sizes(100) == [64, 128]
    assert bucket_sizes(1100)[-1] == 1280  # the budget itself always fits a bucket


def test_bucket_choice_and_lazy_capture_bookkeeping():
    captured, replayed = [], []

    def capture(bucket):
        captured.append(bucket)
        return lambda: replayed.append(bucket)

    eager = []
    cache = GraphCache(bucket_sizes(1536), capture)
    assert cache.bucket_for(1) == 64 and cache.bucket_for(64) == 64 and cache.bucket_for(65) == 128
    assert cache.bucket_for(1025) == 1280 and cache.bucket_for(1536) == 1536
    assert cache.bucket_for(1537) is None  # eager fallback above the largest bucket
    # first hit: eager run, then capture; later hits: replay only
    assert cache.run(128, lambda: eager.append(128)) == "captured"
    assert cache.run(128, lambda: eager.append(128)) == "replay"
    assert cache.run(64, lambda: eager.append(64)) == "captured"
    assert cache.run(128, lambda: eager.append(128)) == "replay"
    assert eager == [128, 64] and captured == [128, 64] and replayed == [128, 128]
    assert (cache.captures, cache.replays) == (2, 2)


def test_padding_adds_a_dummy_row_and_empty_rows():
    host = prepare(np.array([5, 6, 7, 8, 9], np.int32), np.array([0, 2, 5]), 2, pad_to=8, rows_to=5)
    assert host.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert host.cu_seqlens.tolist() == [0, 2, 5, 8, 8, 8]
    assert host.positions.tolist() == [2, 3, 2, 3, 4, 2, 3, 4]  # RoBERTa-style offset 2
    assert host.seq_ids.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert host.first.tolist() == [0, 2, 5, 7, 7] and host.last.tolist() == [1, 4, 7, 7, 7]
    assert host.lengths.tolist() == [2, 3, 3, 1, 1] and host.rows == 2
    with pytest.raises(ValueError):
        prepare(np.zeros(5, np.int32), np.array([0, 5]), 0, pad_to=8, rows_to=1)  # no room for the pad row


@pytest.fixture(scope="module")
def chunks(model_info):
    ids = TextEncoder(model_info).encode(mixed_texts(40))
    return list(pack_chunks(ids, 700, 16))


def test_graph_path_equals_eager_path_on_cpu(model_info, chunks):
    eager = Engine(model_info, "cpu", graphs=False)
    captures = []

    def fake_capture(engine, bucket):
        captures.append(bucket)
        return lambda: engine._static_forward(bucket)

    graphed = Engine(
        model_info,
        "cpu",
        graphs=True,
        max_batch_tokens=1024,
        max_batch_seqs=16,
        capture=fake_capture,
        model=eager.model,
    )
    for c in chunks + chunks:  # the second pass replays captured buckets
        want = eager.embed(c.input_ids, c.cu_seqlens)
        got = graphed.embed(c.input_ids, c.cu_seqlens)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert graphed.graphs.replays >= len(chunks)
    assert len(captures) == len(set(captures)) == graphed.graphs.captures
    assert all(b % 64 == 0 for b in captures)


def test_batches_above_the_largest_bucket_run_eagerly(model_info, chunks):
    def no_capture(engine, bucket):
        raise AssertionError("nothing should be captured")

    engine = Engine(model_info, "cpu", graphs=True, max_batch_tokens=64, max_batch_seqs=16, capture=no_capture)
    big = max(chunks, key=lambda c: len(c.input_ids))
    assert len(big.input_ids) > 64
    assert engine.embed(big.input_ids, big.cu_seqlens).shape == (len(big.cu_seqlens) - 1, 384)
    assert engine.graphs.captures == 0


def test_replicas_share_weights(model_info):
    engine = Engine(model_info, "cpu")
    replica = engine.replicate()
    assert replica.model is engine.model
    assert replica.attention is not engine.attention


def test_graphs_refused_without_cuda(model_info):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Engine(model_info, "cpu", graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_eager(model_info, chunks):
    eager = Engine(model_info, "cuda", graphs=False)
    graphed = Engine(model_info, "cuda", graphs=True, max_batch_tokens=1024, max_batch_seqs=16, model=eager.model)
    for c in chunks + chunks:
        want = eager.embed(c.input_ids, c.cu_seqlens)
        got = graphed.embed(c.input_ids, c.cu_seqlens)
        np.testing.assert_allclose(got, want, atol=2e-3)  # fp16: same kernels, same order
    assert graphed.graphs.replays >= len(chunks)


def test_each_step_says_how_it_ran(model_info, chunks):
    """``handle.run``, which the worker's metrics count: the first batch of a bucket runs eagerly and
    captures, later ones replay, batches above the largest bucket and engines without graphs run eagerly."""
    eager = Engine(model_info, "cpu", graphs=False)
    graphed = Engine(
        model_info,
        "cpu",
        graphs=True,
        max_batch_tokens=1024,
        max_batch_seqs=16,
        capture=lambda engine, bucket: lambda: engine._static_forward(bucket),
        model=eager.model,
    )
    c = chunks[0]
    assert eager.step(c.input_ids, c.cu_seqlens).run == "eager"
    assert graphed.step(c.input_ids, c.cu_seqlens).run == "captured"
    assert graphed.step(c.input_ids, c.cu_seqlens).run == "replay"
    long = np.ones(1100, np.int32) * 1000  # above the largest bucket (1024): eager
    cu = np.array([0, 250, 500, 750, 1000, 1100], np.int32)
    assert graphed.step(long, cu).run == "eager"
    assert (graphed.graphs.captures, graphed.graphs.replays) == (1, 1)
