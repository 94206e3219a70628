import numpy as np
import pytest

from embedfleet.services.tokenizer.cuts import SERIAL_CHARS
from embedfleet.services.tokenizer.encoder import TextEncoder, encode_all, pack_chunks
from embedfleet.shared.errors import ErrorCode, ServiceError
from tests.support.corpus import mixed_texts


@pytest.fixture(scope="module")
def encoder(model_info) -> TextEncoder:
    return TextEncoder(model_info)


def test_ids_equal_reference_tokenizer_without_padding(encoder, reference):
    texts = mixed_texts(120)
    ours = encoder.encode(texts)
    ref = reference.tokenizer(texts, truncation=True, max_length=reference.max_seq_length)["input_ids"]
    assert ours == ref
    lengths = {len(s) for s in ours}
    assert len(lengths) > 20, "no padding: lengths vary"


@pytest.mark.parametrize("count", [3, 400])  # under and over the size tokenized one by one
def test_encode_all_gives_the_batch_calls_encodings(encoder, count):
    texts = mixed_texts(count)
    pairs = [(texts[i], texts[-1 - i]) for i in range(count)]
    serial = sum(map(len, texts)) <= SERIAL_CHARS
    assert serial == (count == 3) and (2 * sum(map(len, texts)) <= SERIAL_CHARS) == serial
    tokenizer = encoder._by_mode["right"]
    for inputs in (texts, pairs):
        for special in (True, False):
            ours = encode_all(tokenizer, inputs, special)
            ref = tokenizer.encode_batch(inputs, add_special_tokens=special)
            assert [(e.ids, e.type_ids, e.offsets) for e in ours] == [(e.ids, e.type_ids, e.offsets) for e in ref]
    assert encode_all(tokenizer, []) == []


def test_truncates_at_model_limit_not_tokenizer_json(encoder):
    long_text = "word " * 1000
    (ids,) = encoder.encode([long_text])
    assert len(ids) == 256  # tokenizer.json alone would cut at 128
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP] kept


def test_truncate_off_refuses_long_input(encoder):
    with pytest.raises(ServiceError) as err:
        encoder.encode(["short", "word " * 300], truncate=False)
    assert err.value.code is ErrorCode.INPUT_TOO_LONG
    assert err.value.row == 1 and err.value.text().startswith("input 1 has 302 tokens; the model's limit is 256")
    assert [len(s) for s in encoder.encode(["a b"], truncate=False)] == [4]


def _lengths(n_per_seq):
    return [[1] * n for n in n_per_seq]


def test_pack_chunks_respects_budgets_and_order():
    seqs = [list(range(i * 10, i * 10 + n)) for i, n in enumerate([5, 3, 8, 2, 9, 4, 4])]
    chunks = list(pack_chunks(seqs, max_tokens=12, max_seqs=3))
    assert [c.start for c in chunks] == [0, 2, 4, 5]
    for c in chunks:
        assert c.cu_seqlens[0] == 0 and c.cu_seqlens[-1] == len(c.input_ids)
        assert len(c.cu_seqlens) - 1 <= 3
        assert len(c.input_ids) <= 12
        assert c.input_ids.dtype == np.int32
    # concatenating every chunk gives back every sequence in order
    flat = np.concatenate([c.input_ids for c in chunks])
    np.testing.assert_array_equal(flat, np.concatenate([np.array(s) for s in seqs]))


def test_sequence_over_budget_gets_its_own_chunk():
    chunks = list(pack_chunks(_lengths([2, 50, 2]), max_tokens=10, max_seqs=100))
    assert [(c.start, len(c.cu_seqlens) - 1, len(c.input_ids)) for c in chunks] == [(0, 1, 2), (1, 1, 50), (2, 1, 2)]


def test_sequence_cap():
    chunks = list(pack_chunks(_lengths([1] * 10), max_tokens=1000, max_seqs=4))
    assert [len(c.cu_seqlens) - 1 for c in chunks] == [4, 4, 2]


QUERIES = ["what is a generator?", "how do I sort a list " * 40]
DOCS = ["A generator is a function that yields values lazily.", "Use sorted() or list.sort(). " * 60]


def test_pairs_equal_reference_tokenizer(encoder, reference):
    ids, types = encoder.encode_pairs(list(zip(QUERIES, DOCS)))
    ref = reference.tokenizer(QUERIES, DOCS, truncation=True, max_length=256)
    assert ids == ref["input_ids"] and types == ref["token_type_ids"]
    assert len(ids[1]) == 256 and set(types[1]) == {0, 1}


def test_left_truncation_equals_reference(encoder, reference, model_info):
    from transformers import AutoTokenizer

    left = AutoTokenizer.from_pretrained(str(model_info.path), truncation_side="left")
    text = " ".join(f"word{i}" for i in range(400))
    (ids,) = encoder.encode([text], direction="left")
    assert ids == left(text, truncation=True, max_length=256)["input_ids"]
    assert ids[:2] != encoder.encode([text])[0][:2]


def test_token_id_inputs_are_checked_and_cut(encoder):
    long = np.arange(1000, 1300, dtype=np.int32)
    right, left = encoder.check_ids([long])[0], encoder.check_ids([long], direction="left")[0]
    assert right.tolist() == list(range(1000, 1256)) and left.tolist() == list(range(1044, 1300))
    with pytest.raises(ServiceError) as err:
        encoder.check_ids([np.array([101], np.int32), np.array([101, 30522], np.int32)])
    assert err.value.code is ErrorCode.INVALID_TOKENS and err.value.row == 1
    assert err.value.text() == "input 1 has token ids outside the vocabulary [0, 30522)"
    with pytest.raises(ServiceError) as err:
        encoder.check_ids([long], truncate=False)
    assert err.value.code is ErrorCode.INPUT_TOO_LONG


def test_prompts_from_folder_and_config(model_info):
    from dataclasses import replace

    from embedfleet.shared.protocol import EmbedOptions

    info = replace(model_info, prompts={"query": "query: ", "document": "passage: "})
    enc = TextEncoder(info, {"document": "doc: ", "code": "code: "})
    assert enc.with_prompt(["x"], EmbedOptions(prompt_name="query")) == ["query: x"]
    assert enc.with_prompt(["x"], EmbedOptions(input_type="document")) == ["doc: x"]  # config wins
    assert enc.with_prompt(["x"], EmbedOptions(input_type="other")) == ["x"]  # a hint, not a demand
    with pytest.raises(ServiceError, match="no prompt 'other'"):
        enc.with_prompt(["x"], EmbedOptions(prompt_name="other"))


def test_pack_chunks_carries_token_types():
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    types = [[0, 0, 1], [0, 1], [0, 0, 1, 1]]
    chunks = list(pack_chunks(ids, max_tokens=5, max_seqs=10, token_types=types))
    assert [c.token_types.tolist() for c in chunks] == [[0, 0, 1, 0, 1], [0, 0, 1, 1]]


@pytest.mark.slow  # megabytes of text
@pytest.mark.parametrize("direction", ["right", "left"])
def test_long_texts_are_cut_before_tokenizing_with_the_same_ids(model_info, direction):
    """Documents far over the limit are cut at a whitespace before tokenizing: the ids must equal
    those of tokenizing the whole text, for prose, code-like and adversarial texts."""
    import random

    from embedfleet.services.tokenizer.cuts import cut_chars
    from tests.support.corpus import long_texts, mixed_texts

    encoder = TextEncoder(model_info)
    rng = random.Random(0)
    texts = (
        long_texts(100)
        + mixed_texts(100)
        + [
            "x" * 20000,  # no whitespace: not cut
            ("a" * 300 + " ") * 60,  # very long words: the cut text does not reach the limit
            "word " * 5000,
            "\n".join(["line"] * 4000),
            "é" * 5000 + " b" * 3000,
        ]
        + [
            " ".join(
                rng.choice(["αβγ", "東京", "https://example.com/" + "q" * 50, "naïve", "x=1;", "🙂"])
                for _ in range(3000)
            )
            for _ in range(10)
        ]
    )
    whole = [e.ids for e in encoder._by_mode[direction].encode_batch(texts, add_special_tokens=True)]
    assert encoder.encode(texts, True, direction) == whole
    assert len(cut_chars("word " * 5000, 2048, direction)) < 2100  # the cut is taken
    assert cut_chars("x" * 20000, 2048, direction) == "x" * 20000


def _without_post_processor(model_info, tmp_path, tokenizer_config: dict):
    import json
    import shutil

    from embedfleet.shared.model_dir.load import load_model_info

    folder = tmp_path / "decoder"
    shutil.copytree(model_info.path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = None  # as a Llama-style tokenizer.json: the flags below decide
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return TextEncoder(load_model_info(str(folder)))


@pytest.mark.parametrize(
    "flags, single, pair",
    [
        ({"add_bos_token": True, "add_eos_token": True}, [101, 7592, 2088, 102], [101, 1037, 102, 101, 1038, 102]),
        ({"add_bos_token": False, "add_eos_token": True}, [7592, 2088, 102], [1037, 102, 1038, 102]),
        ({"add_bos_token": True}, [101, 7592, 2088], [101, 1037, 101, 1038]),
    ],
)
def test_bos_and_eos_from_tokenizer_config(model_info, tmp_path, flags, single, pair):
    """e5-mistral and other Llama-style tokenizers add their end-of-sequence token by a flag in
    tokenizer_config.json, not in tokenizer.json: a last-token pooled vector depends on it."""
    encoder = _without_post_processor(
        model_info, tmp_path, {**flags, "bos_token": "[CLS]", "eos_token": {"content": "[SEP]"}}
    )
    assert encoder.encode(["hello world"]) == [single]
    ids, types = encoder.encode_pairs([("a", "b")])
    assert ids == [pair] and types == [[0] * (len(pair) // 2) + [1] * (len(pair) // 2)]


def test_tokenizer_config_flag_naming_an_unknown_token_is_refused(model_info, tmp_path):
    from embedfleet.shared.config.option import ConfigError

    with pytest.raises(ConfigError, match="sets add_eos_token but '</s>' is not in the vocabulary"):
        _without_post_processor(model_info, tmp_path, {"add_eos_token": True, "eos_token": "</s>"})


def test_tokenizer_json_that_already_adds_the_tokens_is_kept(model_info, tmp_path):
    import json
    import shutil

    from embedfleet.shared.model_dir.load import load_model_info

    folder = tmp_path / "bert"
    shutil.copytree(model_info.path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**config, "add_bos_token": True, "add_eos_token": True, "bos_token": "[CLS]", "eos_token": "[SEP]"})
    )
    encoder = TextEncoder(load_model_info(str(folder)))
    assert encoder.encode(["hello world"]) == [[101, 7592, 2088, 102]]
    assert encoder.encode_pairs([("a", "b")])[0] == [[101, 1037, 102, 1038, 102]]  # BERT's own pair template


def test_decode_equals_the_reference_tokenizer(encoder, reference):
    texts = mixed_texts(30)
    ids = [np.asarray(seq, np.int32) for seq in encoder.encode(texts)]
    for skip in (True, False):
        want = [reference.tokenizer.decode(seq.tolist(), skip_special_tokens=skip) for seq in ids]
        assert encoder.decode(ids, skip_special_tokens=skip) == want
    assert encoder.decode([np.array([101, 7592, 102], np.int32)], skip_special_tokens=False) == ["[CLS] hello [SEP]"]
    # ids past the vocabulary are left out, as the tokenizers library leaves them out
    assert encoder.decode([np.array([7592, 2**31 - 1, 2088], np.int32)]) == ["hello world"]


@pytest.mark.parametrize(
    "ids, fragment",
    [
        ([np.array([], np.int32)], "ids[0] has no token IDs"),
        ([np.array([1], np.int32), np.array([7, -3], np.int32)], "ids[1] holds a negative"),
    ],
)
def test_decode_refuses_empty_and_negative_ids(encoder, ids, fragment):
    with pytest.raises(ServiceError) as err:
        encoder.decode(ids)
    assert err.value.code is ErrorCode.INVALID_TOKENS and fragment in err.value.message


def test_several_requests_encoded_in_one_call_equal_each_alone(encoder):
    texts = mixed_texts(30)
    requests = [texts[:1], texts[1:13], texts[13:14], texts[14:]]
    assert encoder.encode_each(requests) == [encoder.encode(r) for r in requests]
    assert encoder.encode_each(requests, True, "left") == [encoder.encode(r, True, "left") for r in requests]
    pairs = [[(texts[0], texts[1])], [(texts[2], texts[3]), (texts[4], "word " * 400)]]
    assert encoder.encode_pairs_each(pairs) == [encoder.encode_pairs(p) for p in pairs]


def test_a_request_too_long_untruncated_gets_its_own_error_in_a_group(encoder):
    requests = [["short"], ["a b", "word " * 300], ["c"]]
    first, second, third = encoder.encode_each(requests, truncate=False)
    assert first == encoder.encode(["short"]) and third == encoder.encode(["c"])
    assert isinstance(second, ServiceError) and (second.code, second.row) == (ErrorCode.INPUT_TOO_LONG, 1)
    assert second.text() == "input 1 has 302 tokens; the model's limit is 256 (send truncate=true to cut it)"
    pairs = [[("q", "word " * 300)], [("q", "d")]]
    too_long, fine = encoder.encode_pairs_each(pairs, truncate=False)
    assert isinstance(too_long, ServiceError) and (too_long.code, too_long.row) == (ErrorCode.INPUT_TOO_LONG, 0)
    assert fine == encoder.encode_pairs([("q", "d")], truncate=False)


def test_pack_chunks_takes_token_id_arrays_as_lists():
    lists = [[101, 7, 102], [101, 8, 9, 102], [101, 102]]
    arrays = [np.array(s, dtype=np.int32) for s in lists]
    for a, b in zip(pack_chunks(lists, 7, 10), pack_chunks(arrays, 7, 10), strict=True):
        assert a.start == b.start and a.input_ids.dtype == b.input_ids.dtype == np.int32
        assert a.input_ids.tolist() == b.input_ids.tolist() and a.cu_seqlens.tolist() == b.cu_seqlens.tolist()
    assert [c.input_ids.tolist() for c in pack_chunks(arrays, 7, 10)] == [[101, 7, 102, 101, 8, 9, 102], [101, 102]]
    assert [c.cu_seqlens.tolist() for c in pack_chunks(lists, 7, 10)] == [[0, 3, 7], [0, 2]]
