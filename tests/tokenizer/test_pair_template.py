"""LLM rerankers' pairs tokenized as sentence-transformers' CrossEncoder tokenizes them: rendered by the
model's chat template (flat or structured messages, the folder's default prompt as a system message),
cut at the limit with the template's tail written back; token ids equal, pair by pair."""

from __future__ import annotations

import json
import shutil

import pytest

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import mixed_texts
from tests.support.tiny_llm_rerankers import (
    MAX_LENGTH,
    RERANK_TEMPLATE,
    STRUCTURED_TEMPLATE,
    build_llm_reranker,
    reference,
    reference_ids,
)

VARIANTS = {
    "chat": {},
    "chat-prompt": {"prompt": "Given a question, retrieve passages that answer it"},
    "structured-prompt": {"template": STRUCTURED_TEMPLATE, "prompt": "Find the answer"},
    "text-pairs": {"template": None, "prompt": "query: "},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm-rerankers")
    return {name: build_llm_reranker(root, name=name, **kwargs) for name, kwargs in VARIANTS.items()}


def _pairs() -> list[tuple[str, str]]:
    texts = mixed_texts(24)
    # short and long queries and documents; an empty document; a long query with a short document
    return [(texts[i], texts[(i * 7 + 1) % 24]) for i in range(24)] + [("what is it", ""), (texts[7], "short")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_ids_equal_the_reference(folders, variant):
    folder = folders[variant]
    model, pairs = reference(folder), _pairs()
    want = reference_ids(model, pairs)
    encoder = TextEncoder(load_model_info(str(folder)))
    got, types = encoder.encode_pairs(pairs)
    assert got == want
    assert sum(len(s) == MAX_LENGTH for s in got) >= 3  # truncated pairs are compared too
    if variant == "text-pairs":
        assert types is not None and encoder.pair_prompt == "query: "
    else:
        assert types is None
        # a cut pair still ends with the template's tail: the last token is the one the answer follows
        whole, _ = encoder.encode_pairs([("q", "d")])
        cut = next(s for s in got if len(s) == MAX_LENGTH)
        assert cut[-4:] == whole[0][-4:]


def test_no_truncation_refuses_and_left_truncation_keeps_the_end(folders):
    folder = folders["chat"]
    encoder = TextEncoder(load_model_info(str(folder)))
    long_pair = ("a question", " ".join(["word"] * 400))
    with pytest.raises(ServiceError) as err:
        encoder.encode_pairs([("short", "pair"), long_pair], truncate=False)
    assert err.value.code is ErrorCode.INPUT_TOO_LONG and err.value.row == 1 and "input 1 has" in err.value.text()
    tokenizer = reference(folder).tokenizer
    messages = [{"role": "query", "content": long_pair[0]}, {"role": "document", "content": long_pair[1]}]
    whole = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert len(whole) > MAX_LENGTH
    left, _ = encoder.encode_pairs([long_pair], direction="left")
    assert left[0] == whole[-MAX_LENGTH:]


def test_templates_that_cannot_serve_are_refused_at_start(folders, tmp_path):
    folder = shutil.copytree(folders["chat"], tmp_path / "no-document")
    document = '{{ messages | selectattr("role", "eq", "document") | map(attribute="content") | first }}'
    assert document in RERANK_TEMPLATE
    (folder / "chat_template.jinja").write_text(RERANK_TEMPLATE.replace(document, ""))
    with pytest.raises(ConfigError, match="drops the document"):
        TextEncoder(load_model_info(str(folder)))

    folder = shutil.copytree(folders["chat"], tmp_path / "short-limit")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 64}))
    with pytest.raises(ConfigError, match=r"the chat template alone takes \d+ tokens, the model's limit 64"):
        TextEncoder(load_model_info(str(folder)))
