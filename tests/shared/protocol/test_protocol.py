import msgpack
import numpy as np
import pytest

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import (
    VERSION,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    ProtocolError,
    RerankRequest,
    RerankResult,
    TokenChunk,
    decode,
    encode,
)


def _chunk(**kw) -> TokenChunk:
    args = dict(
        id="r1",
        model="m",
        start=2,
        total=5,
        input_ids=np.array([101, 7, 102, 101, 102], dtype=np.int32),
        cu_seqlens=np.array([0, 3, 5], dtype=np.int32),
        deadline=123.5,
        options=EmbedOptions(normalize=False, dimensions=64, dtype="f2", truncate=False),
    )
    args.update(kw)
    return TokenChunk(**args)


def test_embed_request_round_trip():
    msg = EmbedRequest(id="a", model="m", texts=["x", "héllo"], deadline=1.5, options=EmbedOptions(dimensions=8))
    assert decode(encode(msg)) == msg


def test_token_chunk_round_trip_keeps_little_endian_bytes():
    msg = _chunk()
    raw = msgpack.unpackb(encode(msg))
    assert raw["v"] == VERSION and raw["t"] == "tokens"
    assert raw["ids"] == np.array([101, 7, 102, 101, 102], dtype="<i4").tobytes()
    out = decode(encode(msg))
    assert isinstance(out, TokenChunk)
    assert out.count == 2 and out.num_tokens == 5
    np.testing.assert_array_equal(out.input_ids, msg.input_ids)
    np.testing.assert_array_equal(out.cu_seqlens, msg.cu_seqlens)
    assert out.options == msg.options
    assert "pt" not in raw and out.prompt_tokens == 0  # absent unless a model skips prompt tokens: old messages decode
    assert decode(encode(_chunk(prompt_tokens=7))).prompt_tokens == 7


def test_result_round_trip_and_array_view():
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    msg = EmbedResult(id="a", start=1, total=3, dim=3, dtype="f4", data=vectors.tobytes(), tokens=9)
    out = decode(encode(msg))
    assert out == msg and out.count == 2
    np.testing.assert_array_equal(out.array(), vectors)


def test_error_and_rerank_round_trip():
    err = ErrorReply("a", ErrorCode.TIMEOUT, "late")
    assert decode(encode(err)) == err
    req = RerankRequest(id="q", model="m", query="q?", texts=["a", "b"], deadline=3.0, top_n=1)
    assert decode(encode(req)) == req
    res = decode(encode(RerankResult("q", np.array([1, 0], np.int32), np.array([0.9, 0.1], np.float32))))
    assert res.indices.tolist() == [1, 0] and res.scores.dtype == np.dtype("<f4")


def test_decode_request_round_trip_keeps_little_endian_ids():
    msg = DecodeRequest(
        "d", "m", [np.array([101, 7592, 102], np.int32), np.array([2088], np.int32)], skip_special_tokens=False
    )
    raw = msgpack.unpackb(encode(msg))
    assert (raw["t"], raw["ss"]) == ("decode", False)
    assert raw["tk"] == [np.array([101, 7592, 102], "<i4").tobytes(), np.array([2088], "<i4").tobytes()]
    out = decode(encode(msg))
    assert isinstance(out, DecodeRequest) and (out.id, out.model, out.skip_special_tokens) == ("d", "m", False)
    assert [ids.tolist() for ids in out.ids] == [[101, 7592, 102], [2088]]
    raw.pop("ss")  # absent: special tokens are skipped, TEI's default
    assert decode(msgpack.packb(raw)).skip_special_tokens is True
    assert decode(encode(DecodeResult("d", ["hello world", ""]))) == DecodeResult("d", ["hello world", ""])


def test_rerank_options_and_candidate_vectors():
    req = RerankRequest(
        id="q",
        model="m",
        query="q?",
        texts=[],
        deadline=3.0,
        raw_scores=True,
        truncate=False,
        vectors=np.arange(6, dtype=np.float32).reshape(3, 2),
    )
    got = decode(encode(req))
    assert got.raw_scores and not got.truncate and got.count == 3
    np.testing.assert_array_equal(got.vectors, req.vectors)
    body = msgpack.unpackb(encode(req))
    for bad, why in (
        ({"cd": 4}, "n \\* dim"),
        ({"cd": 0}, "dim"),
        ({"x": ["a"]}, "not both"),
        ({"rs": 1}, "true or false"),
    ):
        with pytest.raises(ProtocolError, match=why):
            decode(msgpack.packb({**body, **bad}))


def test_unknown_error_code_becomes_internal():
    raw = msgpack.packb({"v": VERSION, "t": "error", "id": "a", "c": "martian", "e": "?"})
    assert decode(raw).code is ErrorCode.INTERNAL


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\xc1\xc1", "not a msgpack"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (msgpack.packb({"v": 0, "t": "embed"}), "unsupported protocol version 0: this service reads v2$"),
        (msgpack.packb({"v": 3, "t": "embed"}), "version 3: this service reads v2; upgrade it to the sender's release"),
        (msgpack.packb({"v": VERSION, "t": "pickle"}), "unknown message type"),
        (
            msgpack.packb({"v": VERSION, "t": "embed", "id": "a", "m": "m", "x": ["a", 3], "dl": 1.0}),
            "texts must be strings",
        ),
        (
            msgpack.packb({"v": VERSION, "t": "embed", "id": "a", "m": "m", "x": ["a"], "dl": "soon"}),
            "'dl' must be a number",
        ),
        (msgpack.packb({"v": VERSION, "t": "embed", "id": 5, "m": "m", "x": ["a"], "dl": 1.0}), "'id' must be str"),
    ],
)
def test_rejects_malformed(data, message):
    with pytest.raises(ProtocolError, match=message):
        decode(data)


def _raw_tokens(**kw) -> bytes:
    body = msgpack.unpackb(encode(_chunk()))
    body.update(kw)
    return msgpack.packb(body)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ids": b"\x01\x02\x03"}, "whole number of int32"),
        ({"cu": np.array([0, 3, 4], "<i4").tobytes()}, "cu_seqlens"),
        ({"cu": np.array([0, 3, 3, 5], "<i4").tobytes()}, "cu_seqlens"),
        ({"cu": np.array([1, 5], "<i4").tobytes()}, "cu_seqlens"),
        ({"cu": b""}, "cu_seqlens"),
        ({"s": 4}, "rows out of range"),
        ({"s": -1}, "must not be negative"),
        ({"o": {"dt": "f8"}}, "dtype"),
        ({"o": {"d": 0}}, "dimensions"),
        ({"o": {"n": "yes"}}, "normalize"),
        ({"pt": -1}, "must not be negative"),
        ({"pt": 1 << 21}, "prompt_tokens must be between 0 and"),
        ({"pt": "5"}, "pt"),
    ],
)
def test_rejects_bad_token_chunks(fields, message):
    with pytest.raises(ProtocolError, match=message):
        decode(_raw_tokens(**fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"vec": b"\x00" * 10}, "whole number of rows"),
        ({"vec": b""}, "whole number of rows"),
        ({"dim": 0}, "dimension"),
        ({"dt": "i8"}, "dtype"),
        ({"s": 3}, "rows out of range"),
    ],
)
def test_rejects_bad_results(fields, message):
    good = EmbedResult(id="a", start=1, total=3, dim=2, dtype="f4", data=np.zeros(4, "<f4").tobytes(), tokens=1)
    body = msgpack.unpackb(encode(good))
    body.update(fields)
    with pytest.raises(ProtocolError, match=message):
        decode(msgpack.packb(body))


def test_decode_as_checks_the_type():
    from embedfleet.shared.protocol import decode_as

    data = encode(ErrorReply("a", ErrorCode.TIMEOUT, "late"))
    assert decode_as(data, ErrorReply).message == "late"
    with pytest.raises(ProtocolError, match="expected a 'tokens' message, got 'error'"):
        decode_as(data, TokenChunk)


def test_bit_packed_results_hold_ceil_dim_over_8_bytes_a_row():
    from embedfleet.shared.protocol import EmbedResult, JobResult, ProtocolError, decode_as, encode, row_bytes

    assert [row_bytes(dt, 385) for dt in ("f4", "f2", "i1", "u1", "b1", "ub1")] == [1540, 770, 385, 385, 49, 49]
    rows = bytes(range(98))  # two rows of 385 bits
    result = decode_as(encode(EmbedResult("r", 0, 2, 385, "b1", rows, 3)), EmbedResult)
    assert result.count == 2 and result.array().shape == (2, 49) and result.array().dtype == "i1"
    with pytest.raises(ProtocolError, match="whole number of rows"):
        decode_as(encode(EmbedResult("r", 0, 2, 385, "b1", rows[:-1], 3)), EmbedResult)
    job = decode_as(encode(JobResult("job", 0, 0, ["a", "b"], 385, "ub1", rows, 3)), JobResult)
    assert job.array().shape == (2, 49)
    with pytest.raises(ProtocolError, match="one vector per document"):
        decode_as(encode(JobResult("job", 0, 0, ["a"], 385, "ub1", rows, 3)), JobResult)


def test_a_huge_unknown_dtype_is_refused_without_being_echoed():
    """Found by the mutation fuzzer: a sparse request's error quoted its dtype whole (100 kB)."""
    from embedfleet.shared.protocol import EmbedOptions, ProtocolError

    with pytest.raises(ProtocolError) as refused:
        EmbedOptions(output="sparse", dtype="x" * 100_000)
    assert len(str(refused.value)) <= 300 and "options.dtype" in str(refused.value)
    with pytest.raises(ProtocolError, match="sparse values are sent as f4 or f2, not 'i1'"):
        EmbedOptions(output="sparse", dtype="i1")


def test_dense_options_ignore_sparse_settings_on_the_wire():
    """Found by the mutation fuzzer: a dense request carrying sparse settings decoded them, and encoded
    back without them (they mean nothing to dense vectors): now they are not read at all."""
    from embedfleet.shared.protocol import EmbedOptions

    options = EmbedOptions.from_wire({"dt": "f2", "sk": 5, "sth": 0.0})
    assert options.output == "dense" and options.sparse_top_k is None and options.sparse_threshold is None
    sparse = EmbedOptions.from_wire({"out": "sparse", "sk": 5, "sth": 0.5})
    assert (sparse.sparse_top_k, sparse.sparse_threshold) == (5, 0.5)


def test_workers_to_pass_over_round_trip_and_are_bounded():
    msg = EmbedRequest(id="a", model="m", texts=["x"], deadline=1.5, avoid=("w1", "w2"))
    assert decode(encode(msg)) == msg
    assert "av" not in msgpack.unpackb(encode(EmbedRequest(id="a", model="m", texts=["x"], deadline=1.5)))
    body = msgpack.unpackb(encode(msg))
    for forged, why in (
        (["w"] * 65, "at most 64"),
        ("w1", "at most 64"),
        ([""], "1 to 1024"),
        (["w" * 1025], "1 to 1024"),
        ([7], "1 to 1024"),
    ):
        with pytest.raises(ProtocolError, match=why):
            decode(msgpack.packb(body | {"av": forged}))
