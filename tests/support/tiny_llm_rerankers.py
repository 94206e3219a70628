"""Tiny random-weight LLM rerankers, saved as sentence-transformers CrossEncoder folders, built offline.

A causal LM of a decoder family (``…ForCausalLM``) with a Qwen-style byte-level BPE tokenizer that has
"yes" and "no" as whole tokens and ChatML's special tokens, and Qwen3-Reranker's reranking chat template
(query and document as messages, the instruction from a system message or its default). The folder is
made as a user makes one from Qwen/Qwen3-Reranker-0.6B: ``CrossEncoder(causal_lm_folder)`` (which adds
LogitScore on "yes" / "no"), then ``save``.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM

from tests.support.tiny_models import _FAMILIES, _randomize, _wordpiece

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Reranker's prompt as a chat template (the form sentence-transformers' CrossEncoder renders pairs
# with: roles "query" and "document", a "system" message when a prompt applies)
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    '<Instruct>: {{ messages | selectattr("role", "eq", "system") | map(attribute="content") | first'
    ' | default("' + DEFAULT_INSTRUCTION + '") }}\n'
    '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content") | first }}\n'
    '<Document>: {{ messages | selectattr("role", "eq", "document") | map(attribute="content") | first }}'
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
# the same prompt reading typed content parts, which sentence-transformers sends to a template that
# looks for them ("structured" messages)
STRUCTURED_TEMPLATE = (
    '<|im_start|>system\nJudge the Document against the Query. Answer "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "{% for m in messages %}{% if m.role == 'system' %}<Instruct>: {{ m.content[0].text }}\n"
    "{% elif m.role == 'query' %}<Query>: {{ m.content[0].text }}\n"
    "{% elif m.role == 'document' %}<Document>: {{ m.content[0].text }}{% endif %}{% endfor %}"
    "<|im_end|>\n<|im_start|>assistant\n"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
MAX_LENGTH = 256  # the folders' limit (tokenizer_config.json's model_max_length)
VOCAB_SIZE = 8256  # config.json: more rows than the tokenizer's tokens, as Qwen3's 151936 for 151669


@functools.cache
def _qwen_bpe() -> str:
    """A byte-level BPE in Qwen2Tokenizer's pipeline (8192 trained tokens, "yes" and "no" among them),
    ChatML's special tokens first, Qwen3's "<think>" / "</think>" added after."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    vocab = json.loads(_wordpiece())["model"]["vocab"]
    words = [word.removeprefix("##") for word in vocab if not word.startswith("[")]
    lines = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)] + ["yes", "no"] * 200
    tokenizer = Tokenizer(
        models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    return tokenizer.to_str()


def build_llm_reranker(
    root: Path,
    family: str = "qwen3",
    *,
    name: str | None = None,
    template: str | None = RERANK_TEMPLATE,
    prompt: str | None = None,
    true_only: bool = False,
    tied: bool = False,
) -> Path:
    """Write ``root/<name>`` (default ``<family>-llm``), a CrossEncoder folder: ``…ForCausalLM`` + LogitScore.

    ``template``: the chat template pairs are rendered with (None: no chat template, pairs tokenized
    as text pairs). ``prompt``: saved as the default prompt (a system message, or the query's prefix
    without a template). ``true_only``: LogitScore scores logit["yes"] alone. ``tied``: the LM head
    shares the input embeddings (no lm_head.weight saved).
    """
    spec = _FAMILIES[family]
    folder = Path(root) / (name or f"{family}-llm")
    base = Path(root) / f".{folder.name}-causal-lm"
    for path in (folder, base):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    torch.manual_seed(0)
    config = dict(
        spec.config, vocab_size=VOCAB_SIZE, tie_word_embeddings=tied, bos_token_id=None, eos_token_id=2, pad_token_id=0
    )
    model = AutoModelForCausalLM.from_config(spec.config_cls(**config))
    _randomize(model)
    model.save_pretrained(base, safe_serialization=True)
    Tokenizer.from_str(_qwen_bpe()).save(str(base / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": MAX_LENGTH,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "padding_side": "left",
    }
    if template is not None:
        tokenizer_config["chat_template"] = template
    (base / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    prompts = {"web": prompt} if prompt is not None else None
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.modules import LogitScore

    ce = CrossEncoder(str(base), device="cpu", prompts=prompts, default_prompt_name="web" if prompts else None)
    if true_only:
        ce[1] = LogitScore(true_token_id=ce[1].true_token_id)
    ce.save(str(folder))
    shutil.rmtree(base)
    return folder


def reference(folder: Path) -> CrossEncoder:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu")


def reference_ids(model: CrossEncoder, pairs: list[tuple[str, str]]) -> list[list[int]]:
    """The token ids sentence-transformers feeds its model for each pair (left padding removed)."""
    features = model.preprocess(pairs, prompt=model._resolve_prompt(None, None))
    return [row[mask.bool()].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"])]
