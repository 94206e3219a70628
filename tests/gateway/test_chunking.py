"""The `chunking` option: parsing and refusals in the API's shape, and the mean of chunk vectors."""

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.chunking import Chunking, body_chunking, chunk_places, mean_of_chunks
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs, Limits
from embedfleet.services.gateway.openai.api import parse_embeddings_request
from embedfleet.services.gateway.openai.body import ChunkingBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.text_chunks import ChunkSpec, TextChunk

LIMITS = Limits(max_inputs=10, max_input_chars=100)


def _chunking(raw: object) -> Chunking | None:
    """A body's ``chunking`` as the typed route reads it (None: absent)."""
    body = {"model": "m", "input": "a text"} | ({} if raw is None else {"chunking": raw})
    return parse_embeddings_request(orjson.dumps(body), LIMITS).chunking


def test_a_chunking_object_is_read_with_its_defaults():
    assert _chunking(None) is None
    assert _chunking({"size": 64}) == Chunking(ChunkSpec(64, 0, "token"), False, "chunks")
    assert _chunking({"size": 64, "overlap": 8, "boundary": "sentence", "late": False, "return": "mean"}) == Chunking(
        ChunkSpec(64, 8, "sentence"), False, "mean"
    )


@pytest.mark.parametrize(
    "raw, param, message",
    [
        ([64], "chunking", "'chunking' must be an object, got array"),
        ({"overlap": 2}, "chunking.size", "'chunking.size' is required"),
        ({"size": 64, "stride": 2}, "chunking", "'chunking' has unknown keys 'stride'"),
        ({"size": 0}, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        ({"size": "64"}, "chunking.size", "'chunking.size' must be an integer, got '64'"),
        ({"size": True}, "chunking.size", "'chunking.size' must be an integer, got true"),
        ({"size": 8, "overlap": 8}, "chunking", "chunking.overlap (8) must be less than chunking.size (8)"),
        ({"size": 8, "overlap": -1}, "chunking.overlap", "'chunking.overlap' must be at least 0, got -1"),
        ({"size": 8, "boundary": "word"}, "chunking.boundary", "'chunking.boundary' must be 'token' or 'sentence'"),
        ({"size": 8, "late": "yes"}, "chunking.late", "'chunking.late' must be true or false"),
        ({"size": 8, "return": "all"}, "chunking.return", "'chunking.return' must be 'chunks' or 'mean'"),
    ],
)
def test_a_wrong_chunking_object_is_refused_with_its_parameter(raw, param, message):
    with pytest.raises(ApiError) as err:
        _chunking(raw)
    assert err.value.code is ErrorCode.INVALID_REQUEST and err.value.status == 400
    assert err.value.param == param and err.value.message.startswith(message), err.value.message


def test_the_mean_weighs_chunks_by_their_tokens_and_is_normalised_when_asked():
    vectors = np.array([[1, 0], [0, 1], [3, 4], [0, 2]], np.float32)
    chunks = [[TextChunk(0, 5, 0, 3), TextChunk(4, 9, 2, 3)], [TextChunk(0, 4, 0, 4)], [TextChunk(0, 0, 0, 0)]]
    raw = mean_of_chunks(vectors, chunks, normalize=False)
    np.testing.assert_allclose(raw, [[0.75, 0.25], [3, 4], [0, 2]], rtol=1e-6)  # 3 and 1 tokens; an empty input alone
    unit = mean_of_chunks(vectors, chunks, normalize=True)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)


def test_chunk_places_name_each_row_input_by_input():
    chunks = [[TextChunk(0, 5, 0, 3), TextChunk(4, 9, 2, 5)], [], [TextChunk(0, 4, 0, 4)]]
    assert chunk_places(chunks) == [
        {"index": 0, "chunk": 0, "start": 0, "end": 5},
        {"index": 0, "chunk": 1, "start": 4, "end": 9},
        {"index": 2, "chunk": 0, "start": 0, "end": 4},
    ]


@pytest.mark.parametrize("field", ["input", "inputs", "texts"])
def test_token_ids_have_no_text_to_cut_and_are_refused_naming_the_routes_field(field):
    body = ChunkingBody(size=8)
    assert body_chunking(body, Inputs(["a"], None), field) == Chunking(ChunkSpec(8))
    with pytest.raises(ApiError) as err:
        body_chunking(body, Inputs([], [np.array([101, 102], np.int32)]), field)
    assert (err.value.status, err.value.param) == (400, "chunking")
    assert err.value.message == f"'chunking' cuts texts: give '{field}' as text, not token IDs"
