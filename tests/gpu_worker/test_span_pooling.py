"""The engine's output "spans" (late chunking): a vector per span of a row's tokens, the mean of the
span's last hidden states from one forward pass over the whole row, then the folder's Dense layers;
against transformers' last_hidden_state and sentence-transformers' Dense modules (cosine >=
COSINE_TOLERANCE, float32 on CPU); and hostile spans refused, naming their row, by the engine and by
the protocol's decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.errors import InvalidSpans
from embedfleet.services.gpu_worker.engine.pooling import postprocess
from embedfleet.services.gpu_worker.engine.span_pooling import span_means
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions, ProtocolError, Spans, TokenChunk, decode, encode
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts

SPANS = EmbedOptions(output="spans", truncate=False)


@pytest.fixture(scope="module")
def engine(model_info) -> Engine:
    return Engine(model_info, device="cpu")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    long = next(t for t in mixed_texts(48) if len(t) > 3000)
    return [long[:900], "Late chunking pools each chunk from the states of the whole text.", long[900:1500]]


def _hf_states(path, texts: list[str]) -> tuple[list[np.ndarray], list[torch.Tensor]]:
    """transformers' own tokens and last hidden states of each text alone ([CLS] text [SEP])."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path)).eval()
    ids, states = [], []
    for text in texts:
        batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=256)
        with torch.inference_mode():
            states.append(model(**batch).last_hidden_state[0].float())
        ids.append(batch["input_ids"][0].numpy().astype(np.int32))
    return ids, states


def _packed(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate(ids), np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int32)


def _spans_of(ids: list[np.ndarray]) -> list[list[tuple[int, int]]]:
    """Overlapping spans inside the first row, none in the second (its work asks for a dense vector), the
    whole content of the third."""
    n = len(ids[0])
    return [[(1, 9), (5, 40), (40, n - 1), (n // 2, n // 2 + 1)], [], [(1, len(ids[2]) - 1)]]


def test_span_means_equal_the_mean_of_each_span_however_far_into_the_batch():
    torch.manual_seed(0)
    hidden = torch.randn(4000, 6) * 3 + 500  # large sums: a float32 running sum would lose the spans' digits
    firsts = torch.tensor([0, 3990, 1200, 1205, 7], dtype=torch.int64)
    ends = torch.tensor([1, 4000, 1300, 1210, 3999], dtype=torch.int64)
    got = span_means(hidden, firsts, ends)
    want = torch.stack([hidden[a:b].double().mean(0) for a, b in zip(firsts.tolist(), ends.tolist())])
    assert got.dtype == torch.float32 and got.shape == (5, 6)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_each_span_is_the_mean_of_its_tokens_states_in_the_whole_row(engine, model_info, texts):
    ids, states = _hf_states(model_info.path, texts)
    rows = _spans_of(ids)
    input_ids, cu = _packed(ids)
    spans = Spans.of(rows)
    engine.check(input_ids, cu, spans=spans)
    made = engine.step(input_ids, cu, outputs=("dense", "spans"), spans=spans).result()
    want = np.stack([states[i][a:b].mean(0).numpy() for i, row in enumerate(rows) for a, b in row])
    assert made["spans"].shape == (len(want), 384)
    assert cosines(made["spans"], want).min() >= COSINE_TOLERANCE
    np.testing.assert_allclose(made["spans"], want, atol=2e-4)
    # the same forward's dense vectors are the rows' ordinary ones
    alone = engine.embed(input_ids, cu)
    assert cosines(made["dense"], alone).min() >= COSINE_TOLERANCE


def test_the_folders_dense_layers_follow_the_span_means(model_info, tmp_path, texts):
    """A folder with Dense layers (sentence-transformers saved it): a span's vector is Dense(mean of its states)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(0)
    dense = [
        Dense(384, 128, bias=True, activation_function=torch.nn.Tanh()),
        Dense(128, 64, bias=False, activation_function=torch.nn.Identity()),
    ]
    modules = [Transformer(str(model_info.path)), Pooling(384, "cls"), *dense, Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "dense"))
    info = load_model_info(str(tmp_path / "dense"))
    assert info.pooling == "cls" and len(info.dense) == 2  # spans are means whatever the model's pooling
    ids, states = _hf_states(model_info.path, texts)
    rows = _spans_of(ids)
    input_ids, cu = _packed(ids)
    made = Engine(info, device="cpu").step(input_ids, cu, outputs=("spans",), spans=Spans.of(rows)).result()["spans"]
    means = torch.stack([states[i][a:b].mean(0) for i, row in enumerate(rows) for a, b in row])
    with torch.inference_mode():
        features = {"sentence_embedding": means}
        for layer in dense:
            features = layer(features)
    want = torch.nn.functional.normalize(features["sentence_embedding"], dim=1).numpy()
    got = postprocess(made, True, None, np.float32)
    assert got.shape == want.shape == (len(means), 64)
    assert cosines(got, want).min() >= COSINE_TOLERANCE


def test_spans_come_with_their_output_only(engine):
    ids, cu = np.array([101, 2000, 102], np.int32), np.array([0, 3], np.int32)
    with pytest.raises(ValueError):
        engine.step(ids, cu, outputs=("spans",))
    with pytest.raises(ValueError):
        engine.step(ids, cu, outputs=("dense", "tokens"), spans=Spans.of([[(1, 2)]]))


CU = np.array([0, 5, 8], np.int32)  # rows of 5 and 3 tokens


@pytest.mark.parametrize(
    "rows, row, message",
    [
        ([[(1, 4)], [(0, 4)]], 1, "has a span [0, 4) outside its 3 tokens"),
        ([[(3, 1)], [(0, 3)]], 0, "has a span [3, 1) outside"),
        ([[(2, 2)], [(0, 3)]], 0, "has a span [2, 2) outside"),
        ([[(-1, 2)], [(0, 3)]], 0, "has a span [-1, 2) outside"),
        ([[(0, 1)], [(0, 1), (1, 2), (2, 3), (0, 3)]], 1, "has more spans than tokens"),
    ],
    ids=["past-the-row", "reversed", "empty", "negative", "too-many"],
)
def test_hostile_spans_are_refused_naming_their_row(engine, rows, row, message):
    spans = Spans.of(rows)
    ids = np.full(8, 1000, np.int32)
    with pytest.raises(InvalidSpans) as err:
        engine.check(ids, CU, spans=spans)
    assert err.value.row == row and err.value.message.startswith(message), err.value.message
    chunk = TokenChunk("r", "m", 0, 2, ids, CU, 1.0, SPANS, spans=spans)
    with pytest.raises(ProtocolError) as refused:
        decode(encode(chunk))
    assert str(refused.value).startswith(f"spans: row {row} {message}"), refused.value


def test_counts_that_do_not_match_the_rows_or_the_spans_are_refused(engine):
    ids = np.full(8, 1000, np.int32)
    few = Spans(np.array([1], np.int32), np.array([0], np.int32), np.array([2], np.int32))  # one count, two rows
    lying = Spans(np.array([1, 2**30], np.int32), np.array([0, 0], np.int32), np.array([2, 2], np.int32))
    for spans in (few, lying):
        with pytest.raises(InvalidSpans):
            engine.check(ids, CU, spans=spans)
        with pytest.raises(ProtocolError, match="spans: "):
            decode(encode(TokenChunk("r", "m", 0, 2, ids, CU, 1.0, SPANS, spans=spans)))
    with pytest.raises(ProtocolError, match="spans come only with output 'spans'"):
        decode(encode(TokenChunk("r", "m", 0, 2, ids, CU, 1.0, spans=Spans.of([[(0, 1)], [(0, 1)]]))))
    with pytest.raises(ProtocolError, match="field 'sn' must be bytes"):
        decode(encode(TokenChunk("r", "m", 0, 2, ids, CU, 1.0, SPANS)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_spans_match_cpu(model_info, engine, texts):
    ids, _ = _hf_states(model_info.path, texts)
    input_ids, cu = _packed(ids)
    spans = Spans.of(_spans_of(ids))
    gpu = Engine(model_info, device="cuda").step(input_ids, cu, outputs=("spans",), spans=spans).result()["spans"]
    cpu = engine.step(input_ids, cu, outputs=("spans",), spans=spans).result()["spans"]
    assert cosines(gpu, cpu).min() >= 0.999  # float16 on the GPU
